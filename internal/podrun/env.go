package podrun

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// env is the container's environment as the kubelet sets it: envFrom's
// ConfigMaps and Secrets, then env's values, Secret and ConfigMap keys and
// the pod's own fields.
func (k *Kubelet) env(t testing.TB, pod *corev1.Pod, c *corev1.Container) []string {
	t.Helper()
	var env []string
	for _, from := range c.EnvFrom {
		var data map[string][]byte
		switch {
		case from.ConfigMapRef != nil:
			data = k.configMap(t, pod.Namespace, from.ConfigMapRef.Name)
		case from.SecretRef != nil:
			data = k.secret(t, pod.Namespace, from.SecretRef.Name)
		}
		for key, v := range data {
			env = append(env, from.Prefix+key+"="+string(v))
		}
	}
	for _, e := range c.Env {
		if v, ok := k.envValue(t, pod, e); ok {
			env = append(env, e.Name+"="+v)
		}
	}
	return env
}

// envValue is the value of one env entry, and false for an optional key
// that is absent.
func (k *Kubelet) envValue(t testing.TB, pod *corev1.Pod, e corev1.EnvVar) (string, bool) {
	t.Helper()
	var (
		data        map[string][]byte
		source, key string
		optional    *bool
	)
	switch from := e.ValueFrom; {
	case from == nil:
		return e.Value, true
	case from.FieldRef != nil:
		switch from.FieldRef.FieldPath {
		case "metadata.namespace":
			return pod.Namespace, true
		case "metadata.name":
			return pod.Name, true
		case "spec.serviceAccountName":
			return pod.Spec.ServiceAccountName, true
		}
		t.Fatalf("env %s: field %s, which podrun does not fill", e.Name, from.FieldRef.FieldPath)
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		data, source, key, optional = k.secret(t, pod.Namespace, ref.Name), "Secret "+ref.Name, ref.Key, ref.Optional
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		data, source, key, optional = k.configMap(t, pod.Namespace, ref.Name), "ConfigMap "+ref.Name, ref.Key, ref.Optional
	default:
		t.Fatalf("env %s: a value source podrun does not fill: %+v", e.Name, from)
	}
	v, ok := data[key]
	if !ok && (optional == nil || !*optional) {
		t.Fatalf("env %s: %s has no key %s", e.Name, source, key)
	}
	return string(v), ok
}

// volumeFiles are the files of the pod's named volume, a Secret or a
// ConfigMap, by path in the volume.
func (k *Kubelet) volumeFiles(t testing.TB, pod *corev1.Pod, name string) map[string][]byte {
	t.Helper()
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name })
	if i < 0 {
		t.Fatalf("the container mounts %s, which the pod does not have", name)
	}
	v := pod.Spec.Volumes[i]
	var data map[string][]byte
	var items []corev1.KeyToPath
	switch {
	case v.Secret != nil:
		data, items = k.secret(t, pod.Namespace, v.Secret.SecretName), v.Secret.Items
	case v.ConfigMap != nil:
		data, items = k.configMap(t, pod.Namespace, v.ConfigMap.Name), v.ConfigMap.Items
	default:
		t.Fatalf("volume %s is neither a Secret nor a ConfigMap, which podrun does not mount: %+v", name, v.VolumeSource)
	}
	if len(items) == 0 {
		return data // every key, under its own name
	}
	files := map[string][]byte{}
	for _, it := range items {
		d, ok := data[it.Key]
		if !ok {
			t.Fatalf("volume %s has no key %s", name, it.Key)
		}
		files[it.Path] = d
	}
	return files
}

func (k *Kubelet) secret(t testing.TB, ns, name string) map[string][]byte {
	t.Helper()
	s, err := k.Clientset.CoreV1().Secrets(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Data
}

func (k *Kubelet) configMap(t testing.TB, ns, name string) map[string][]byte {
	t.Helper()
	cm, err := k.Clientset.CoreV1().ConfigMaps(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data := map[string][]byte{}
	for key, v := range cm.Data {
		data[key] = []byte(v)
	}
	return data
}
