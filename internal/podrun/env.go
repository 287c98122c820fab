package podrun

import (
	"maps"
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
			data = k.configMap(t, pod.Namespace, from.ConfigMapRef.Name, from.ConfigMapRef.Optional)
		case from.SecretRef != nil:
			data = k.secret(t, pod.Namespace, from.SecretRef.Name, from.SecretRef.Optional)
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
			if pod.Name == "" {
				t.Fatalf("env %s: the pod's name, which a pod of a template does not have yet", e.Name)
			}
			return pod.Name, true
		case "spec.serviceAccountName":
			return pod.Spec.ServiceAccountName, true
		}
		t.Fatalf("env %s: field %s, which podrun does not fill", e.Name, from.FieldRef.FieldPath)
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		data, source, key, optional = k.secret(t, pod.Namespace, ref.Name, ref.Optional), "Secret "+ref.Name, ref.Key, ref.Optional
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		data, source, key, optional = k.configMap(t, pod.Namespace, ref.Name, ref.Optional), "ConfigMap "+ref.Name, ref.Key, ref.Optional
	default:
		t.Fatalf("env %s: a value source podrun does not fill: %+v", e.Name, from)
	}
	v, ok := data[key]
	if !ok && (optional == nil || !*optional) {
		t.Fatalf("env %s: %s has no key %s", e.Name, source, key)
	}
	return string(v), ok
}

// file is a file of a volume: its content and its mode.
type file struct {
	data []byte
	mode os.FileMode
}

// volumeFiles are the files of the pod's named volume, a Secret or a
// ConfigMap, by path in the volume, with their modes (0644 unless the
// volume says otherwise).
func (k *Kubelet) volumeFiles(t testing.TB, pod *corev1.Pod, name string) map[string]file {
	t.Helper()
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name })
	if i < 0 {
		t.Fatalf("the container mounts %s, which the pod does not have", name)
	}
	v := pod.Spec.Volumes[i]
	var (
		data        map[string][]byte
		items       []corev1.KeyToPath
		defaultMode *int32
		optional    *bool
	)
	switch {
	case v.Secret != nil:
		optional, defaultMode, items = v.Secret.Optional, v.Secret.DefaultMode, v.Secret.Items
		data = k.secret(t, pod.Namespace, v.Secret.SecretName, optional)
	case v.ConfigMap != nil:
		optional, defaultMode, items = v.ConfigMap.Optional, v.ConfigMap.DefaultMode, v.ConfigMap.Items
		data = k.configMap(t, pod.Namespace, v.ConfigMap.Name, optional)
	default:
		t.Fatalf("volume %s is neither a Secret nor a ConfigMap, which podrun does not mount: %+v", name, v.VolumeSource)
	}
	mode := func(m *int32) os.FileMode {
		switch {
		case m != nil:
			return os.FileMode(*m)
		case defaultMode != nil:
			return os.FileMode(*defaultMode)
		}
		return 0o644
	}
	files := map[string]file{}
	if len(items) == 0 { // every key, under its own name
		for key, d := range data {
			files[key] = file{d, mode(nil)}
		}
		return files
	}
	for _, it := range items {
		d, ok := data[it.Key]
		switch {
		case ok:
			files[it.Path] = file{d, mode(it.Mode)}
		case optional == nil || !*optional:
			t.Fatalf("volume %s has no key %s", name, it.Key)
		}
	}
	return files
}

// secret is the data of the namespace's Secret, or nil for an optional
// one that does not exist.
func (k *Kubelet) secret(t testing.TB, ns, name string, optional *bool) map[string][]byte {
	t.Helper()
	s, err := k.Clientset.CoreV1().Secrets(ns).Get(t.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && optional != nil && *optional {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return s.Data
}

// configMap is the data and binary data of the namespace's ConfigMap, or
// nil for an optional one that does not exist.
func (k *Kubelet) configMap(t testing.TB, ns, name string, optional *bool) map[string][]byte {
	t.Helper()
	cm, err := k.Clientset.CoreV1().ConfigMaps(ns).Get(t.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && optional != nil && *optional {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	data := maps.Clone(cm.BinaryData)
	if data == nil {
		data = map[string][]byte{}
	}
	for key, v := range cm.Data {
		data[key] = []byte(v)
	}
	return data
}
