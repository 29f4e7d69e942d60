package access

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What plan says agent mode makes is what Setup makes: each object it
// lists that Setup keeps exists after Setup, under that name.
func TestMadeIsWhatSetupMakes(t *testing.T) {
	ctx := context.Background()
	c := newClient()
	if err := Setup(ctx, c); err != nil {
		t.Fatal(err)
	}
	made := Made("registry.local:5000/library/kubelift-agent@sha256:"+strings.Repeat("a", 64), 4)
	kept := 0
	for _, m := range made {
		ns, name, ok := strings.Cut(m.Name, "/")
		if !ok {
			ns, name = "", m.Name
		}
		var err error
		switch m.Kind {
		case "Namespace":
			_, err = c.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		case "ServiceAccount":
			_, err = c.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
		case "Role":
			_, err = c.RbacV1().Roles(ns).Get(ctx, name, metav1.GetOptions{})
		case "RoleBinding":
			_, err = c.RbacV1().RoleBindings(ns).Get(ctx, name, metav1.GetOptions{})
		case "ValidatingAdmissionPolicy":
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
		case "ValidatingAdmissionPolicyBinding":
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
		default:
			if !strings.Contains(m.What, "deleted at the run's end") {
				t.Errorf("%s %s: neither made by Setup nor said to be deleted", m.Kind, m.Name)
			}
			continue
		}
		kept++
		if err != nil {
			t.Errorf("plan lists %s %s, which Setup did not make: %v", m.Kind, m.Name, err)
		}
	}
	if kept != 6 {
		t.Errorf("%d of Setup's 6 objects listed", kept)
	}
}
