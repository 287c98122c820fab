package install

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/lockwarden/lockwarden/internal/podrun"
)

// startContainer runs the named container of the pod from make image's
// image, as the kubelet would (podrun): kwok only pretends to.
func startContainer(t *testing.T, pod *corev1.Pod, name string, extraArgs ...string) *podrun.Process {
	t.Helper()
	kubelet := &podrun.Kubelet{Clientset: clientset, Host: pl.Config.Host, CAData: pl.Config.CAData}
	return kubelet.Start(t, img.runnable(), pod, name, extraArgs...)
}
