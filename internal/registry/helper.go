package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// helperTimeout bounds a credential helper (one that asks a vault over
// the network included).
const helperTimeout = 30 * time.Second

var helperNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// HelperCredentials asks the docker credential helper NAME (the program
// docker-credential-NAME on PATH, docker's protocol: `get` with the
// server on stdin, {"Username","Secret"} on stdout) for domain's user and
// password. What it prints is not trusted: a user with a ':' or control
// characters, or an empty secret, is refused.
func HelperCredentials(ctx context.Context, name, domain string) (user, password string, err error) {
	if !helperNameRE.MatchString(name) {
		return "", "", fmt.Errorf("credential helper %q: want the NAME of a docker-credential-NAME program", name)
	}
	prog := "docker-credential-" + name
	ctx, cancel := context.WithTimeout(ctx, helperTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, "get")
	cmd.Stdin = strings.NewReader(domain)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		// Only stderr: what it printed on stdout may hold a secret.
		why := strings.TrimSpace(stderr.String())
		if len(why) > 200 {
			why = why[:200]
		}
		return "", "", fmt.Errorf("credential helper %s for %s: %w: %s", prog, domain, err, why)
	}
	var out struct{ Username, Secret string }
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return "", "", fmt.Errorf("credential helper %s for %s: its answer is not docker's JSON: %v", prog, domain, err)
	}
	if out.Username == "" || strings.ContainsAny(out.Username, ":\n\r\x00") || len(out.Username) > 256 {
		return "", "", fmt.Errorf("credential helper %s for %s: user %q: want a user name with no ':' or control characters", prog, domain, out.Username)
	}
	if out.Secret == "" {
		return "", "", fmt.Errorf("credential helper %s for %s: no secret for user %s", prog, domain, out.Username)
	}
	return out.Username, out.Secret, nil
}
