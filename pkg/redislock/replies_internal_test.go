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
		resent        bool
		result, cause error
	}{
		{2, false, nil, ErrReleased},
		{0, false, nil, ErrReleased},
		{0, true, nil, ErrReleased},
		{-1, false, ErrNotHeld, ErrLeaseLost},
		{-2, false, ErrNotOwner, ErrNotOwner},
		{-3, false, ErrNotOwner, ErrNotOwner},
		// Sent twice, and the ownership gone: the first send may have
		// freed it, and what it left been lost since.
		{-1, true, ErrLeaseLost, ErrLeaseLost},
		{-2, true, ErrLeaseLost, ErrLeaseLost},
		{-9, false, ErrUnexpectedReply, ErrNotOwner},
	} {
		result, cause := released(tc.reply, tc.resent)
		if !errors.Is(result, tc.result) || tc.result == nil && result != nil || !errors.Is(cause, tc.cause) {
			t.Errorf("released(%d, resent %v) = %v, %v; want %v, %v", tc.reply, tc.resent, result, cause, tc.result, tc.cause)
		}
	}
}
