package redislock

import (
	"errors"
	"testing"
)

// Every answer of release.lua maps to a typed, documented result of Unlock
// and cause of the Hold's end.
func TestReleaseRepliesMapToTypedErrors(t *testing.T) {
	for _, tc := range []struct {
		reply         int64
		result, cause error
	}{
		{2, nil, ErrReleased},
		{0, nil, ErrReleased},
		{-1, ErrNotHeld, ErrLeaseLost},
		{-2, ErrNotOwner, ErrNotOwner},
		{-3, ErrNotOwner, ErrNotOwner},
		{-9, ErrUnexpectedReply, ErrNotOwner},
	} {
		result, cause := released(tc.reply)
		if !errors.Is(result, tc.result) || tc.result == nil && result != nil || !errors.Is(cause, tc.cause) {
			t.Errorf("released(%d) = %v, %v; want %v, %v", tc.reply, result, cause, tc.result, tc.cause)
		}
	}
}
