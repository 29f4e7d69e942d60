// Command bench is `make bench`: it measures kubelift against the tools a
// platform team would otherwise use, in the same run, on the same data, and
// prints each figure with its ratio. Nothing here is a pass/fail test.
//
// Data: 10 images sharing a base layer, over 400 MB of unique blobs, served
// by Debian's docker-registry on loopback. Two parts: bundling (registry to
// one file) and importing (bundle to an empty registry).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kubelift/kubelift/test/env/internet"
)

var (
	rounds      = flag.Int("rounds", 3, "rounds per tool (the median is printed)")
	baseMB      = flag.Int("base-mb", 32, "shared base layer size")
	uniqueMB    = flag.Int("unique-mb", 40, "each image's own layer size")
	keepWorkDir = flag.Bool("keep", false, "keep the work directory")
	linkRate    = flag.String("link", "1gbit,100mbit", "the engine part runs again with each node's link at each of these rates (tc tbf)")
	only        = flag.String("only", "", "run one part: bundle (bundling, verifying, importing), engine (stage, plan and apply on a sandbox), hops (one multi-hop apply against hop-by-hop applies, on a sandbox) or scale (simulated nodes: make bench-scale; not run otherwise)")
)

var repos = []string{
	"kube-apiserver:v1.31.4", "kube-controller-manager:v1.31.4", "kube-scheduler:v1.31.4", "kube-proxy:v1.31.4",
	"pause:3.10", "etcd:3.5.15-0", "coredns/coredns:v1.11.3", "kubelift/user-app:v1", "kubelift/user-db:v1", "kubelift/user-cache:v1",
}

type measure struct {
	wall   time.Duration
	maxRSS int64 // KiB
}

func main() {
	flag.Parse()
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	bin, _ := filepath.Abs("bin")
	work, err := os.MkdirTemp("", "kubelift-bench-")
	if err != nil {
		return err
	}
	if !*keepWorkDir {
		defer os.RemoveAll(work)
	}
	if *only == "scale" {
		return benchScale(ctx, work)
	}
	key := filepath.Join(work, "team")
	if _, err := runCmd(filepath.Join(bin, "bundle"), "keygen", "--out", key); err != nil {
		return err
	}
	if *only == "hops" {
		return benchHops(ctx, work, bin, key)
	}
	if *only != "engine" {
		if err := benchBundle(ctx, work, bin, key); err != nil {
			return err
		}
	}
	if *only != "bundle" {
		if err := benchEngine(ctx, work, bin, key); err != nil {
			return err
		}
	}
	if *only == "" {
		return benchHops(ctx, work, bin, key)
	}
	return nil
}

// benchBundle measures bundling, verifying and importing.
func benchBundle(ctx context.Context, work, bin, key string) error {
	reg, err := internet.StartRegistry(ctx, filepath.Join(work, "registry"), internet.RegistryOptions{})
	if err != nil {
		return err
	}
	defer reg.Stop()
	if _, err := internet.Seed(ctx, reg.Host, repos, internet.ImageShape{Arches: []string{"amd64"}, BaseBytes: *baseMB << 20, UniqueBytes: *uniqueMB << 20}); err != nil {
		return err
	}
	var refs []string
	for _, r := range repos {
		refs = append(refs, reg.Host+"/"+r)
	}
	catalogFile := filepath.Join(work, "catalog.yaml")
	cat := "schemaVersion: 1\narches: [amd64]\nkubeletHashEras: [{era: name-image, from: v1.31.0}]\nversions:\n  - version: v1.31.4\n    kubeletHashEra: name-image\n    upgradeFrom: [v1.30]\n    downgradeTo: []\n    removedKubeletFlags: []\n    removedAPIs: []\n    files: []\n    images:\n"
	for _, r := range refs {
		cat += "      - " + r + "\n"
	}
	if err := os.WriteFile(catalogFile, []byte(cat), 0o644); err != nil {
		return err
	}

	out := filepath.Join(work, "bundle.tar")
	bundleOnce := func(i int, cache string) (measure, error) {
		os.Remove(out)
		return runCmd(filepath.Join(bin, "bundle"), "create", "--catalog", catalogFile, "--kubernetes-version", "v1.31.4",
			"--sign-key", key+".key", "-o", out, "--cache-dir", cache, "--insecure-registry", reg.Host, "--quiet", "--jobs", "4")
	}
	craneLayout := filepath.Join(work, "crane-layout") // the last round's pull, pushed in benchImport
	craneOnce := func(i int) (measure, error) {
		dir := filepath.Join(work, fmt.Sprintf("crane-%d", i))
		defer func() {
			os.RemoveAll(craneLayout)
			os.Rename(dir, craneLayout)
		}()
		return runCmd(filepath.Join(bin, "tools", "crane"), append(append([]string{"pull", "--insecure", "--format=oci"}, refs...), dir)...)
	}
	skopeoOnce := func(i int) (measure, error) {
		dir := filepath.Join(work, fmt.Sprintf("skopeo-%d", i))
		defer os.RemoveAll(dir)
		var total measure
		for _, r := range refs {
			m, err := runCmd("skopeo", "copy", "--quiet", "--all", "--src-tls-verify=false", "docker://"+r, "oci:"+dir+":"+r)
			if err != nil {
				return m, err
			}
			total.wall += m.wall
			total.maxRSS = max(total.maxRSS, m.maxRSS)
		}
		return total, nil
	}

	var kl, cr, sk, warm []measure
	for i := 0; i < *rounds; i++ {
		cache := filepath.Join(work, fmt.Sprintf("cache-%d", i))
		m, err := bundleOnce(i, cache)
		if err != nil {
			return err
		}
		kl = append(kl, m)
		if m, err = bundleOnce(i, cache); err != nil { // everything cached: a re-run
			return err
		}
		warm = append(warm, m)
		os.RemoveAll(cache)
		if m, err = craneOnce(i); err != nil {
			return err
		}
		cr = append(cr, m)
		if m, err = skopeoOnce(i); err != nil {
			return err
		}
		sk = append(sk, m)
	}

	// Bundle size against the unique blobs it must hold.
	var entries struct {
		Images []struct{ Ref, Digest string }
		Bytes  int64
	}
	raw, err := exec.Command(filepath.Join(bin, "bundle"), "inspect", "-o", "json", out).Output()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &entries); err != nil {
		return err
	}
	fi, err := os.Stat(out)
	if err != nil {
		return err
	}

	var ver, sha, cat2 []measure
	for i := 0; i < *rounds; i++ {
		m, err := runCmd(filepath.Join(bin, "bundle"), "verify", "--key", key+".pub", out)
		if err != nil {
			return err
		}
		ver = append(ver, m)
		if m, err = runCmd("sha256sum", out); err != nil {
			return err
		}
		sha = append(sha, m)
		if m, err = runCmd("cat", out); err != nil {
			return err
		}
		cat2 = append(cat2, m)
	}

	mb := float64(entries.Bytes) / 1e6
	fmt.Printf("kubelift bench: %d images sharing a base layer, %.1f MB of unique blobs, docker-registry on loopback, %d rounds (medians)\n\n",
		len(repos), mb, *rounds)
	fmt.Printf("%-44s %9s %9s %10s %s\n", "bundling (registry -> one file)", "time", "MB/s", "peak RSS", "kubelift / peer")
	row("kubelift bundle create (signed, cold cache)", kl, nil, mb)
	row("crane pull --format=oci", cr, kl, mb)
	row("skopeo copy --all (each; converts, new digests)", sk, kl, mb)
	row("kubelift bundle create (warm cache re-run)", warm, nil, mb)
	fmt.Printf("\nbundle size %.1f MB = unique blobs %.1f MB + %.3f %% (tar headers, manifest, signature)\n",
		float64(fi.Size())/1e6, mb, 100*float64(fi.Size()-entries.Bytes)/float64(entries.Bytes))
	size := float64(fi.Size()) / 1e6
	v, s, c := median(ver), median(sha), median(cat2)
	fmt.Printf("\n%-44s %9s %9s %s\n", "verifying the bundle (page cache warm)", "time", "MB/s", "kubelift / peer")
	fmt.Printf("%-44s %8.2fs %9.0f\n", "kubelift bundle verify (signature + sha256 of every entry)", v.wall.Seconds(), size/v.wall.Seconds())
	fmt.Printf("%-44s %8.2fs %9.0f %.2fx\n", "sha256sum of the file", s.wall.Seconds(), size/s.wall.Seconds(), v.wall.Seconds()/s.wall.Seconds())
	fmt.Printf("%-44s %8.2fs %9.0f %.2fx\n", "cat > /dev/null (read speed)", c.wall.Seconds(), size/c.wall.Seconds(), v.wall.Seconds()/c.wall.Seconds())
	return benchImport(ctx, work, bin, key, out, craneLayout, mb)
}

// benchImport pushes the bundle into an empty registry with kubelift, and
// the same images from the extracted layout with skopeo and crane.
//
// crane pushes its own layout of the same images (from crane pull above):
// kubelift's index.json reaches Docker-typed roots through small OCI
// indexes (for skopeo), so crane pushing it would tag those, not upstream's
// digests.
func benchImport(ctx context.Context, work, bin, key, bundleFile, craneLayout string, mb float64) error {
	layout := filepath.Join(work, "extracted")
	if _, err := runCmd(filepath.Join(bin, "bundle"), "extract", "--key", key+".pub", bundleFile, layout); err != nil {
		return err
	}
	var refs []string
	raw, err := os.ReadFile(filepath.Join(layout, "bundle.json"))
	if err != nil {
		return err
	}
	var m struct{ Images []struct{ Ref string } }
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	for _, im := range m.Images {
		refs = append(refs, im.Ref)
	}
	// A fresh, empty registry for every run.
	fresh := func(name string) (*internet.Registry, error) {
		return internet.StartRegistry(ctx, filepath.Join(work, name), internet.RegistryOptions{})
	}
	var kl, sk, cr, again []measure
	for i := 0; i < *rounds; i++ {
		reg, err := fresh(fmt.Sprintf("kubelift-%d", i))
		if err != nil {
			return err
		}
		args := []string{"import", bundleFile, "--key", key + ".pub", "--domain", reg.Host, "--namespace", "bench", "--plain-http", "-q"}
		m, err := runCmd(filepath.Join(bin, "upgrade"), args...)
		if err == nil {
			kl = append(kl, m)
			m, err = runCmd(filepath.Join(bin, "upgrade"), args...) // everything present
			again = append(again, m)
		}
		reg.Stop()
		os.RemoveAll(reg.Dir)
		if err != nil {
			return err
		}

		if reg, err = fresh(fmt.Sprintf("skopeo-%d", i)); err != nil {
			return err
		}
		var total measure
		for _, ref := range refs {
			name := ref[strings.LastIndex(ref, "/")+1:]
			m, err := runCmd("skopeo", "copy", "--quiet", "--all", "--dest-tls-verify=false",
				"oci:"+filepath.Join(layout, "images")+":"+ref, "docker://"+reg.Host+"/bench/"+name)
			if err != nil {
				reg.Stop()
				return err
			}
			total.wall += m.wall
			total.maxRSS = max(total.maxRSS, m.maxRSS)
		}
		sk = append(sk, total)
		reg.Stop()
		os.RemoveAll(reg.Dir)

		if reg, err = fresh(fmt.Sprintf("crane-%d", i)); err != nil {
			return err
		}
		m, err = runCmd(filepath.Join(bin, "tools", "crane"), "push", "--insecure", "--index", craneLayout, reg.Host+"/bench/all:v1")
		reg.Stop()
		os.RemoveAll(reg.Dir)
		if err != nil {
			return err
		}
		cr = append(cr, m)
	}
	fmt.Printf("\n%-44s %9s %9s %10s %s\n", "importing (bundle -> empty registry)", "time", "MB/s", "peak RSS", "kubelift / peer")
	row("kubelift upgrade import (verify + push)", kl, nil, mb)
	row("skopeo copy --all (each; converts, new digests)", sk, kl, mb)
	row("crane push --index (crane's layout, same images)", cr, kl, mb)
	a := median(again)
	fmt.Printf("%-44s %8.2fs (%d images, everything present)\n", "kubelift re-import", a.wall.Seconds(), len(refs))
	return nil
}

// runCmd runs a program under GNU time, discarding its output, and measures
// its wall time and peak RSS. (The RSS is read by /usr/bin/time, a small
// parent: Linux counts a vfork parent's memory in its child's maxrss, and
// this process holds the seeded images.) Dirty pages are synced first, so
// no run pays for the previous one's writeback.
func runCmd(name string, args ...string) (measure, error) {
	if err := exec.Command("sync").Run(); err != nil {
		return measure{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/time", append([]string{"-f", "kubelift-bench-rss %M", name}, args...)...)
	var errb strings.Builder
	cmd.Stderr = &errb
	start := time.Now()
	err := cmd.Run()
	m := measure{wall: time.Since(start)}
	if err != nil {
		return m, fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, errb.String())
	}
	for _, line := range strings.Split(errb.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "kubelift-bench-rss "); ok {
			m.maxRSS, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return m, nil
}

// row prints a tool's median time, throughput and peak RSS, and with
// kubelift's measures the ratio kubelift / tool.
func row(name string, ms, kubelift []measure, mb float64) {
	m := median(ms)
	r := ""
	if kubelift != nil {
		r = fmt.Sprintf("%.2fx", median(kubelift).wall.Seconds()/m.wall.Seconds())
	}
	fmt.Printf("%-44s %8.2fs %9.0f %8d MB %s\n", name, m.wall.Seconds(), mb/m.wall.Seconds(), maxRSS(ms)/1024, r)
}

func median(ms []measure) measure {
	s := append([]measure{}, ms...)
	sort.Slice(s, func(i, j int) bool { return s[i].wall < s[j].wall })
	return s[len(s)/2]
}

func maxRSS(ms []measure) int64 {
	var m int64
	for _, x := range ms {
		m = max(m, x.maxRSS)
	}
	return m
}
