// Package cluster is kubelift's bridge to the cluster's API server: it
// builds clients from a kubeconfig (flag, KUBECONFIG or in-cluster) and
// keeps kubelift's own records there, starting with the versions imported
// and available to upgrade to.
package cluster

import (
	"errors"
	"fmt"
	"os"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ErrNoKubeconfig means none was given, KUBECONFIG is unset and this is not
// a pod.
var ErrNoKubeconfig = errors.New("no kubeconfig: pass --kubeconfig, set KUBECONFIG, or run in a pod")

// Config returns the REST config from an explicit kubeconfig file, else
// KUBECONFIG (or ~/.kube/config when a kubeContext is named), else the
// in-cluster service account; kubeContext, when set, is the kubeconfig's
// context to use.
func Config(kubeconfig, kubeContext string) (*rest.Config, error) {
	if kubeconfig == "" && os.Getenv("KUBECONFIG") == "" && kubeContext == "" {
		if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
			return nil, ErrNoKubeconfig
		}
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config: %w", err)
		}
		return cfg, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		where := kubeconfig
		if where == "" {
			where = "KUBECONFIG=" + os.Getenv("KUBECONFIG")
		}
		return nil, fmt.Errorf("kubeconfig %s: %w", where, err)
	}
	return cfg, nil
}

// Client returns a clientset for Config(kubeconfig, kubeContext).
func Client(kubeconfig, kubeContext string) (kubernetes.Interface, error) {
	cfg, err := Config(kubeconfig, kubeContext)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "kubelift"
	return kubernetes.NewForConfig(cfg)
}
