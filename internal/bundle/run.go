package bundle

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/template"
)

// A .run file is a POSIX shell stub of exactly StubSize bytes, then the
// bundle's tar stream (PayloadSize bytes), then the kubelift `upgrade`
// program (InstallerSize bytes). The stub extracts the program, checks it
// against the signed manifest (with openssl when present) and runs it.

// StubSize is the fixed length of the shell stub.
const StubSize = 8192

const stubMagic = "#!/bin/sh\n# kubelift-run v1\n"

type stubInfo struct {
	PayloadSize     int64
	InstallerSize   int64
	InstallerSHA256 string
}

var stubTemplate = template.Must(template.New("stub").Parse(stubMagic + `# Kubernetes {{.Version}} for linux/{{.Arch}}: a self-extracting, signed
# kubelift bundle. The script ends at "exit"; the signed tar bundle and the
# kubelift upgrade program follow it. Try: sh {{.FileName}} --help
KUBELIFT_STUB_SIZE={{.StubSize}}
KUBELIFT_PAYLOAD_SIZE={{.PayloadSize}}
KUBELIFT_INSTALLER_SIZE={{.InstallerSize}}
KUBELIFT_INSTALLER_SHA256={{.InstallerSHA256}}
set -eu
self=$0
case $self in */*) ;; *) self=./$self ;; esac

usage() {
	cat <<EOF
Usage: $self COMMAND [FLAGS]

Kubernetes {{.Version}} (linux/{{.Arch}}), bundled by kubelift {{.ToolVersion}}.

Commands:
  --help                     show this text
  --verify --key PUB         check the signature and every entry
  --extract DIR --key PUB    verify, then unpack into DIR (all or nothing)
  --upgrade --key PUB ...    import into the private registry, verifying it
                             (and stage on every node, given SSH flags);
                             see "$self --upgrade --help" for its flags
  --info                     print what the bundle holds (not verified)

PUB is your team's public key (PEM), never a key shipped with the bundle.
With openssl and sha256sum on the PATH the stub also checks the embedded
program against the signed manifest before running it.

This file runs its own code, so it cannot vouch for itself: a tampered
copy's --verify says what its tamperer wrote. Check it first with tools
you already trust: an installed kubelift,
  bundle verify {{.FileName}} --key PUB
or openssl, with the detached signature made beside it:
  openssl dgst -sha256 -verify PUB -signature {{.FileName}}.sha256.sig {{.FileName}}.sha256
  sha256sum -c {{.FileName}}.sha256
EOF
}

key_arg() {
	while [ $# -gt 0 ]; do
		case $1 in
		--key) if [ $# -ge 2 ]; then printf '%s\n' "$2"; fi; return 0 ;;
		--key=*) printf '%s\n' "${1#--key=}"; return 0 ;;
		esac
		shift
	done
}

installer() {
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/kubelift.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	trap 'exit 130' INT TERM
	tail -c "$KUBELIFT_INSTALLER_SIZE" "$self" >"$tmp/upgrade"
	if command -v sha256sum >/dev/null 2>&1; then
		sum=$(sha256sum "$tmp/upgrade" | cut -d' ' -f1)
		if [ "$sum" != "$KUBELIFT_INSTALLER_SHA256" ]; then
			echo "$self: the embedded upgrade program is damaged (sha256 $sum): do not use this file" >&2
			exit 1
		fi
	fi
	key=$(key_arg "$@")
	if [ -n "$key" ] && command -v openssl >/dev/null 2>&1; then
		tail -c +$((KUBELIFT_STUB_SIZE + 1)) "$self" | tar -xf - -C "$tmp" --occurrence=1 bundle.json bundle.json.sig 2>/dev/null || true
		if ! openssl dgst -sha256 -verify "$key" -signature "$tmp/bundle.json.sig" "$tmp/bundle.json" >/dev/null 2>&1; then
			echo "$self: the bundle's signature does not verify with $key: do not use this file" >&2
			exit 1
		fi
		if ! grep -q "\"installerSha256\": \"$KUBELIFT_INSTALLER_SHA256\"" "$tmp/bundle.json"; then
			echo "$self: the embedded upgrade program is not the one the signed manifest names: do not use this file" >&2
			exit 1
		fi
	fi
	chmod 0755 "$tmp/upgrade"
	"$tmp/upgrade" "$@"
}

cmd=${1:---help}
[ $# -gt 0 ] && shift
case $cmd in
--help | -h) usage ;;
--verify) installer verify "$self" "$@" ;;
--extract)
	if [ $# -lt 1 ]; then
		echo "$self: --extract needs a directory" >&2
		exit 2
	fi
	dir=$1
	shift
	installer extract "$self" "$dir" "$@"
	;;
--upgrade) installer import "$self" "$@" ;;
--info) installer inspect "$self" "$@" ;;
*)
	echo "$self: unknown command $cmd (see --help)" >&2
	exit 2
	;;
esac
exit
`))

type stubData struct {
	Version, Arch, FileName, ToolVersion string
	StubSize                             int
	PayloadSize, InstallerSize           string
	InstallerSHA256                      string
}

// renderStub returns the StubSize-byte stub. Sizes are padded with spaces so
// the stub's length does not depend on them and can be rewritten in place.
func renderStub(version, arch, fileName, toolVersion string, info stubInfo) ([]byte, error) {
	pad := func(n int64) string { return fmt.Sprintf("%-20d", n) }
	sha := info.InstallerSHA256
	if sha == "" {
		sha = strings.Repeat("0", 64)
	}
	var buf bytes.Buffer
	err := stubTemplate.Execute(&buf, stubData{
		Version: version, Arch: arch, FileName: fileName, ToolVersion: toolVersion,
		StubSize: StubSize, PayloadSize: pad(info.PayloadSize), InstallerSize: pad(info.InstallerSize),
		InstallerSHA256: sha,
	})
	if err != nil {
		return nil, err
	}
	if buf.Len() > StubSize-2 {
		return nil, fmt.Errorf("run stub is %d bytes, more than %d", buf.Len(), StubSize)
	}
	// Pad with a comment so the shell never reads the data that follows.
	buf.WriteString("#" + strings.Repeat(" ", StubSize-buf.Len()-2) + "\n")
	return buf.Bytes(), nil
}

// readStub returns nil when r does not start with a .run stub, and the stub's
// fields (having consumed it) when it does.
func readStub(r *bufio.Reader) (*stubInfo, error) {
	head, err := r.Peek(len(stubMagic))
	if err != nil || string(head) != stubMagic {
		return nil, nil //nolint:nilerr // short input is then read as a tar stream
	}
	stub := make([]byte, StubSize)
	if _, err := io.ReadFull(r, stub); err != nil {
		return nil, &VerifyError{Entry: "run stub", Err: ErrTruncated}
	}
	info := &stubInfo{}
	fields := map[string]bool{}
	for _, line := range strings.Split(string(stub), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "KUBELIFT_STUB_SIZE":
			if v != strconv.Itoa(StubSize) {
				return nil, &VerifyError{Entry: "run stub", Err: fmt.Errorf("%w: stub size %s", ErrNotBundle, v)}
			}
		case "KUBELIFT_PAYLOAD_SIZE":
			info.PayloadSize, err = strconv.ParseInt(v, 10, 64)
		case "KUBELIFT_INSTALLER_SIZE":
			info.InstallerSize, err = strconv.ParseInt(v, 10, 64)
		case "KUBELIFT_INSTALLER_SHA256":
			info.InstallerSHA256 = v
		default:
			continue
		}
		if err != nil {
			return nil, &VerifyError{Entry: "run stub", Err: fmt.Errorf("%w: %s: %v", ErrNotBundle, k, err)}
		}
		fields[k] = true
	}
	if len(fields) != 4 {
		return nil, &VerifyError{Entry: "run stub", Err: fmt.Errorf("%w: stub lacks its size fields", ErrNotBundle)}
	}
	return info, nil
}

// checkInstaller hashes the program after the payload against the manifest.
func checkInstaller(r io.Reader, m *Manifest) error {
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(r, m.InstallerSize))
	if err != nil {
		return &VerifyError{Entry: "installer", Err: err}
	}
	if n != m.InstallerSize {
		return &VerifyError{Entry: "installer", Err: ErrTruncated}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != m.InstallerSHA256 {
		return &VerifyError{Entry: "installer", Err: fmt.Errorf("%w (sha256 %s, signed %s)", ErrModified, got, m.InstallerSHA256)}
	}
	var one [1]byte
	if k, _ := r.Read(one[:]); k > 0 {
		return &VerifyError{Entry: "installer", Err: ErrTrailingData}
	}
	return nil
}
