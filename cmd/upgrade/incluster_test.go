package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/upgradeapi"
)

func fakeUpgrades() *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{upgradeapi.Resource: "UpgradeList"})
}

// runApplyInCluster runs `upgrade apply ARGS` with the Upgrades in dyn.
func runApplyInCluster(t *testing.T, dyn dynamic.Interface, args ...string) (string, string, error) {
	t.Helper()
	out, errOut := &bytes.Buffer{}, &bytes.Buffer{}
	s := &cli.IO{In: strings.NewReader(""), Out: out, ErrOut: errOut}
	cmd := newCmdApply(s, func(ctx context.Context, o *applyOptions) error {
		o.InCluster.Dynamic = func() (dynamic.Interface, error) { return dyn, nil }
		return applyInCluster(ctx, o)
	})
	cmd.SetArgs(args)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// apply --in-cluster --detach writes the Upgrade its flags declare.
func TestApplyInClusterWritesTheUpgrade(t *testing.T) {
	dyn := fakeUpgrades()
	out, _, err := runApplyInCluster(t, dyn, "--in-cluster", "--detach", "--to", "v1.31.4", "--max-unavailable", "25%", "--canary",
		"--selector", "pool=blue", "--settle", "5s", "--drain", "--restore-labels", "--ignore-preflight", "removed-flags",
		"--paused", "--window", "22:00-04:00", "--window-days", "Sat,Sun")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "upgrade v1.31.4: follow it with") {
		t.Errorf("said %q", out)
	}
	u, err := upgradeapi.Client{Dynamic: dyn}.Get(context.Background(), "v1.31.4")
	if err != nil || u == nil {
		t.Fatalf("no upgrade written: %v", err)
	}
	s := u.Spec
	if s.Version != "v1.31.4" || s.MaxUnavailable != "25%" || !s.Canary || s.Selector != "pool=blue" || s.Settle != "5s" || !s.Drain ||
		!s.RestoreLabels || strings.Join(s.IgnorePreflight, ",") != "removed-flags" || !s.Paused || s.ReadyTimeout != "5m0s" ||
		s.Window == nil || s.Window.Start != "22:00" || s.Window.End != "04:00" || strings.Join(s.Window.Days, ",") != "Sat,Sun" {
		t.Errorf("spec %+v window %+v", s, s.Window)
	}
}

// What the controller cannot pass on is refused, naming the flag; so
// are the in-cluster flags without --in-cluster, and a bad window.
func TestApplyInClusterRefuses(t *testing.T) {
	mk := func(s *cli.IO) *cobra.Command {
		return newCmdApply(s, func(context.Context, *applyOptions) error { return nil })
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--in-cluster", "--to", "v1.31.4", "--pre-hook", "true"}, "--pre-hook with --in-cluster"},
		{[]string{"--in-cluster", "--to", "v1.31.4", "--via", "ssh"}, "--via with --in-cluster"},
		{[]string{"--in-cluster", "--to", "v1.31.4", "--ssh-key", "id"}, "--ssh-key with --in-cluster"},
		{[]string{"--in-cluster", "--to", "v1.31.4", "--key", "team.pub"}, "--key with --in-cluster"},
		{[]string{"--to", "v1.31.4", "--detach"}, "--detach needs --in-cluster"},
		{[]string{"--to", "v1.31.4", "--window", "22:00-04:00"}, "--window needs --in-cluster"},
		{[]string{"--in-cluster", "--to", "v1.31.4", "--window-days", "Sat"}, "--window-days needs --window"},
	} {
		err := parse(t, mk, tc.args...)
		var usage *cli.UsageError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &usage) {
			t.Errorf("%v: %v, want a usage error saying %q", tc.args, err, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--in-cluster", "--to", "v1.31.4", "--window", "22:00"}, `--window "22:00": want START-END`},
		{[]string{"--in-cluster", "--to", "v1.31.4", "--window", "22:00-4"}, `spec.window: end: "4"`},
		{[]string{"--in-cluster", "--to", "v1.31.4", "--window", "22:00-04:00", "--window-days", "Someday"}, `days: "Someday"`},
	} {
		if _, _, err := runApplyInCluster(t, fakeUpgrades(), tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}

// Run again, apply --in-cluster follows an Upgrade that exists; one that
// failed is written again, which retries it; one to another version is
// refused.
func TestApplyInClusterAgain(t *testing.T) {
	ctx := context.Background()
	dyn := fakeUpgrades()
	c := upgradeapi.Client{Dynamic: dyn}
	u, err := c.Create(ctx, &upgradeapi.Upgrade{ObjectMeta: metav1.ObjectMeta{Name: "v1.31.4"}, Spec: upgradeapi.Spec{Version: "v1.31.4"}})
	if err != nil {
		t.Fatal(err)
	}
	u.Status = upgradeapi.Status{Phase: upgradeapi.Failed, Message: "node worker-1: kubelet: rolled back"}
	if _, err := c.UpdateStatus(ctx, u); err != nil {
		t.Fatal(err)
	}
	_, said, err := runApplyInCluster(t, dyn, "--in-cluster", "--detach", "--to", "v1.31.4", "--settle", "30s")
	if err != nil || !strings.Contains(said, "failed before (node worker-1: kubelet: rolled back): written again") {
		t.Fatalf("after a failure: %v, said %q", err, said)
	}
	if u, _ = c.Get(ctx, "v1.31.4"); u.Spec.Settle != "30s" || u.Spec.Attempt != 1 {
		t.Errorf("spec not written again as the next attempt: %+v", u.Spec)
	}
	u.Status = upgradeapi.Status{Phase: upgradeapi.Running}
	if _, err := c.UpdateStatus(ctx, u); err != nil {
		t.Fatal(err)
	}
	if _, said, err = runApplyInCluster(t, dyn, "--in-cluster", "--detach", "--to", "v1.31.4"); err != nil || !strings.Contains(said, "exists (Running): following it") {
		t.Fatalf("running: %v, said %q", err, said)
	}
	if _, _, err = runApplyInCluster(t, dyn, "--in-cluster", "--detach", "--to", "v1.31.5", "--name", "v1.31.4"); err == nil || !strings.Contains(err.Error(), "is to v1.31.4, not v1.31.5") {
		t.Fatalf("another version under the name: %v", err)
	}
}

// follow prints a line per node step and ends with the Upgrade: nil when
// complete, an error naming the failed node, step and reason.
func TestFollow(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		end     upgradeapi.Status
		wantErr string
	}{
		{upgradeapi.Status{Phase: upgradeapi.Complete, ObservedGeneration: 1, Progress: "2/2",
			Nodes: []upgradeapi.NodeStatus{{Name: "cp-1", Status: "upgraded", Version: "v1.31.4"}, {Name: "worker-1", Status: "upgraded", Version: "v1.31.4"}}}, ""},
		{upgradeapi.Status{Phase: upgradeapi.Failed, ObservedGeneration: 1, Message: "wait Ready: not Ready within 5m0s",
			LastError: &upgradeapi.FailedAction{Node: "worker-1", Step: "kubelet", Reason: "wait Ready: not Ready within 5m0s"}},
			"the upgrade failed: node worker-1, step kubelet: wait Ready: not Ready within 5m0s"},
	} {
		dyn := fakeUpgrades()
		c := upgradeapi.Client{Dynamic: dyn}
		u, err := c.Create(ctx, &upgradeapi.Upgrade{ObjectMeta: metav1.ObjectMeta{Name: "v1.31.4", Generation: 1}, Spec: upgradeapi.Spec{Version: "v1.31.4"}})
		if err != nil {
			t.Fatal(err)
		}
		u.Status = upgradeapi.Status{Phase: upgradeapi.Running, Nodes: []upgradeapi.NodeStatus{{Name: "cp-1", Status: "upgrading", Step: "kube-apiserver"}}}
		if _, err := c.UpdateStatus(ctx, u); err != nil {
			t.Fatal(err)
		}
		// The end is written once follow has read the Upgrade running.
		end := *u
		end.Status = tc.end
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&end)
		if err != nil {
			t.Fatal(err)
		}
		gets := 0
		dyn.PrependReactor("get", "upgrades", func(k8stesting.Action) (bool, runtime.Object, error) {
			if gets++; gets == 2 {
				if err := dyn.Tracker().Update(upgradeapi.Resource, &unstructured.Unstructured{Object: obj}, ""); err != nil {
					t.Error(err)
				}
			}
			return false, nil, nil
		})
		out := &bytes.Buffer{}
		err = follow(ctx, c, "v1.31.4", 1, out, 0)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("follow to %s: %v, want %q", tc.end.Phase, err, tc.wantErr)
		}
		for _, want := range []string{"upgrade v1.31.4: Running", "cp-1: upgrading, kube-apiserver", "upgrade v1.31.4: " + tc.end.Phase} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("follow said:\n%s\nno %q", out.String(), want)
			}
		}
	}
}
