package nodeaccess

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestRun(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	n := f.dial(t, f.dialer(t), srv.target("worker-1", ""))

	out, err := n.Run(context.Background(), "tr a-z A-Z; pwd", strings.NewReader("hello\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "HELLO\n" + srv.dir + "\n"; string(out) != want {
		t.Errorf("stdout = %q, want %q", out, want)
	}
	if _, users, _, _ := srv.seen(); len(users) != 1 || users[0] != "root" {
		t.Errorf("logged in as %q, want root", users)
	}

	out, err = n.Run(context.Background(), "echo partial; echo 'no such unit' >&2; exit 3", nil)
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Code != 3 || exit.Stderr != "no such unit" {
		t.Fatalf("err = %v, want ExitError code 3 with stderr", err)
	}
	if string(out) != "partial\n" {
		t.Errorf("stdout of failed command = %q", out)
	}
	if want := `node worker-1 (` + srv.addr + `): run "echo partial`; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("err = %q, want prefix %q", err, want)
	}
}

func TestRunKeepsStderrTail(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	n := f.dial(t, f.dialer(t), srv.target("worker-1", ""))
	_, err := n.Run(context.Background(), "head -c 100000 /dev/zero | tr '\\0' x >&2; echo END >&2; exit 1", nil)
	var exit *ExitError
	if !errors.As(err, &exit) || len(exit.Stderr) > stderrTail || !strings.HasSuffix(exit.Stderr, "xxxEND") {
		t.Fatalf("err = %.200v, want the last %d bytes of stderr", err, stderrTail)
	}
}

func TestRunAsOtherUserUsesSudo(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	n := f.dial(t, f.dialer(t), srv.target("worker-1", "ubuntu"))

	out, err := n.Run(context.Background(), `echo "it's" $((1+1))`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "it's 2\n" {
		t.Errorf("stdout = %q", out)
	}
	_, users, execs, _ := srv.seen()
	if len(users) != 1 || users[0] != "ubuntu" {
		t.Errorf("logged in as %q, want ubuntu", users)
	}
	if len(execs) != 1 || !strings.HasPrefix(execs[0], "sudo -n ") {
		t.Errorf("server ran %q, want it through sudo -n", execs)
	}
}

func TestRunStopsWhenContextDone(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	n := f.dial(t, f.dialer(t), srv.target("worker-1", ""))

	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"cancelled once running", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			go func() { <-srv.execSeen; cancel() }()
			return ctx, cancel
		}, context.Canceled},
		{"timeout", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			_, err := n.Run(ctx, "sleep 10", nil)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), `node worker-1 (`+srv.addr+`): run "sleep 10"`) {
				t.Fatalf("err = %v, want %v naming node and command", err, tc.want)
			}
		})
	}
	// The connection is still usable.
	if out, err := n.Run(context.Background(), "echo ok", nil); err != nil || string(out) != "ok\n" {
		t.Fatalf("after cancel: %q, %v", out, err)
	}
}

func TestUpload(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	for _, user := range []string{"", "ubuntu"} {
		t.Run("user="+user, func(t *testing.T) {
			n := f.dial(t, f.dialer(t), srv.target("worker-1", user))
			dir := filepath.Join(t.TempDir(), "new dir", "it's")
			dest := filepath.Join(dir, "kubelet")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dest, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			data := bytes.Repeat([]byte("kubelet binary\n"), 100000)

			sent, err := n.Upload(context.Background(), dest, 0o751, bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			if sent != int64(len(data)) {
				t.Errorf("sent %d bytes, want %d", sent, len(data))
			}
			got, err := os.ReadFile(dest)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("uploaded file: %d bytes, %v; want %d bytes", len(got), err, len(data))
			}
			if fi, _ := os.Stat(dest); fi.Mode() != 0o751 {
				t.Errorf("mode = %v, want 0751", fi.Mode())
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("directory holds %d entries, want only the file (no temporary left)", len(entries))
			}
		})
	}
}

func TestUploadFailures(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	n := f.dial(t, f.dialer(t), srv.target("worker-1", ""))
	dir := t.TempDir()
	ro := filepath.Join(dir, "ro")
	if err := os.Mkdir(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		exit       bool
	}{
		{"relative path", "etc/kubelet", false},
		{"unclean path", dir + "/../x", false},
		{"parent is a file", blocker + "/kubelet", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.Upload(context.Background(), tc.path, 0o644, strings.NewReader("data"))
			var exit *ExitError
			if err == nil || errors.As(err, &exit) != tc.exit || !strings.Contains(err.Error(), "node worker-1 (") {
				t.Fatalf("err = %v, want an error naming the node (exit error: %v)", err, tc.exit)
			}
		})
	}
	t.Run("failing reader", func(t *testing.T) {
		dest := filepath.Join(dir, "kubelet")
		boom := errors.New("disk read error")
		sent, err := n.Upload(context.Background(), dest, 0o755, io.MultiReader(strings.NewReader("half a binary"), iotest.ErrReader(boom)))
		if !errors.Is(err, boom) || sent != int64(len("half a binary")) {
			t.Fatalf("sent %d, err = %v; want 13 bytes and %v", sent, err, boom)
		}
		if _, err := os.Stat(dest); !os.IsNotExist(err) {
			t.Errorf("a partial upload was installed: %v", err)
		}
	})
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("directory holds %d entries, want no temporary file left", len(entries))
	}
	if os.Geteuid() != 0 { // root writes anywhere
		_, err := n.Upload(context.Background(), ro+"/kubelet", 0o644, strings.NewReader("data"))
		var exit *ExitError
		if !errors.As(err, &exit) || !strings.Contains(exit.Stderr, "ermission denied") {
			t.Fatalf("err = %v, want permission denied", err)
		}
		if entries, _ := os.ReadDir(ro); len(entries) != 0 {
			t.Errorf("read-only directory holds %d entries", len(entries))
		}
	}
}

func TestUploadScriptRemovesTemporaryOnFailure(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	n := f.dial(t, f.dialer(t), srv.target("worker-1", ""))
	// A destination that is a non-empty directory: mv fails after the
	// temporary file has been written.
	dir := t.TempDir()
	dest := filepath.Join(dir, "busy")
	if err := os.MkdirAll(filepath.Join(dest, "busy", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Upload(context.Background(), dest, 0o644, strings.NewReader("data")); err == nil {
		t.Fatal("upload over a non-empty directory succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want the temporary file removed", len(entries))
	}
}

// A command's standard output is bounded: a node that prints more (here
// without end) is stopped, and the command fails saying so, instead of
// filling this machine's memory; one within the bound is whole.
func TestRunBoundsOutput(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	n := f.dial(t, f.dialer(t, WithMaxOutput(1<<20)), srv.target("worker-1", ""))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := n.Run(ctx, "yes kubelift", nil)
	if !errors.Is(err, ErrOutputTooLarge) || !strings.Contains(err.Error(), "node worker-1") || out != nil {
		t.Fatalf("endless output: %d bytes, %v", len(out), err)
	}
	out, err = n.Run(ctx, "head -c 1048576 /dev/zero", nil)
	if err != nil || len(out) != 1<<20 {
		t.Fatalf("output at the bound: %d bytes, %v", len(out), err)
	}
}

// Stream writes a command's output to w as it comes, larger than Run's
// output bound, through sudo for other users; a failing command fails
// with the node's exit and message.
func TestStream(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t)
	src := filepath.Join(t.TempDir(), "it's a snapshot.db")
	data := bytes.Repeat([]byte("etcd snapshot page\n"), 200000)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"", "ubuntu"} {
		t.Run("user="+user, func(t *testing.T) {
			n := f.dial(t, f.dialer(t, WithMaxOutput(1<<20)), srv.target("worker-1", user))
			var got bytes.Buffer
			k, err := n.Stream(context.Background(), "cat -- "+Quote(src), &got)
			if err != nil || k != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
				t.Fatalf("Stream: %d bytes, %v; want %d bytes", k, err, len(data))
			}
		})
	}
	n := f.dial(t, f.dialer(t), srv.target("worker-1", ""))
	var ee *ExitError
	if _, err := n.Stream(context.Background(), "cat -- "+Quote(src+".gone"), io.Discard); !errors.As(err, &ee) || !strings.Contains(ee.Stderr, "No such file") {
		t.Errorf("a missing file: %v", err)
	}
}
