package install

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lockwarden/lockwarden/internal/podrun"
)

// startContainer runs the named container of a pod spec of namespace ns
// from make image's image, as the kubelet would (podrun): kwok only
// pretends to.
func startContainer(t *testing.T, ns string, spec corev1.PodSpec, name string, extraArgs ...string) *podrun.Process {
	t.Helper()
	kubelet := &podrun.Kubelet{Clientset: clientset, Host: pl.Config.Host, CAData: pl.Config.CAData}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
	return kubelet.Start(t, img.runnable(), pod, name, extraArgs...)
}
