package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Crictl answers the part of crictl that kubelift reads on a node, from
// the CRI stand-in at endpoint: `crictl ps [-a] -o json`, in crictl's
// shape (the CRI ListContainersResponse as JSON: camelCase names, times
// in nanoseconds as strings). Real crictl is not on the Go module proxy;
// the nodes run this under the name crictl, as they run systemctl.
func Crictl(ctx context.Context, endpoint string, args []string, out io.Writer) error {
	all, asJSON := false, false
	if len(args) == 0 || args[0] != "ps" {
		return errors.New("crictl stand-in: only 'ps [-a] -o json' is served")
	}
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-a" || a == "--all":
			all = true
		case a == "-o" && i+1 < len(args) && args[i+1] == "json", a == "--output=json", a == "-ojson":
			asJSON = true
			if a == "-o" {
				i++
			}
		default:
			return fmt.Errorf("crictl stand-in: unsupported argument %q", a)
		}
	}
	if !asJSON {
		return errors.New("crictl stand-in: only -o json output is served")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	req := &kubeapi.ListContainersRequest{}
	if !all {
		req.Filter = &kubeapi.ContainerFilter{State: &kubeapi.ContainerStateValue{State: kubeapi.ContainerState_CONTAINER_RUNNING}}
	}
	list, err := kubeapi.NewRuntimeServiceClient(conn).ListContainers(ctx, req)
	if err != nil {
		return fmt.Errorf("connect: connect endpoint %q: %w", endpoint, err)
	}
	type container struct {
		ID           string            `json:"id"`
		PodSandboxID string            `json:"podSandboxId"`
		Metadata     map[string]any    `json:"metadata"`
		Image        map[string]string `json:"image"`
		ImageRef     string            `json:"imageRef"`
		State        string            `json:"state"`
		CreatedAt    string            `json:"createdAt"`
		Labels       map[string]string `json:"labels"`
		Annotations  map[string]string `json:"annotations"`
	}
	doc := struct {
		Containers []container `json:"containers"`
	}{Containers: []container{}}
	for _, c := range list.Containers {
		doc.Containers = append(doc.Containers, container{ID: c.Id, PodSandboxID: c.PodSandboxId,
			Metadata: map[string]any{"name": c.GetMetadata().GetName(), "attempt": c.GetMetadata().GetAttempt()},
			Image:    map[string]string{"image": c.GetImage().GetImage()}, ImageRef: c.ImageRef, State: c.State.String(),
			CreatedAt: strconv.FormatInt(c.CreatedAt, 10), Labels: c.Labels, Annotations: c.Annotations})
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}
