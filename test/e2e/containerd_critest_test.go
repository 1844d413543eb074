package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// critestVersion is the critest hack/critest.sh builds into its cache.
const critestVersion = "1.36.0"

// critestSkips are the specs critest cannot run on this machine on any handler, each
// with the reason; they are passed to --ginkgo.skip.
var critestSkips = []struct{ spec, why string }{
	{"public image with digest should be pulled and removed",
		"the reference pins upstream's manifest digest (gcr.io/k8s-staging-cri-tools/test-image-digest@sha256:9700f9a2...), " +
			"which no locally built image can have, and there is no internet"},
	{"runtime should support MaskedPaths",
		"it expects sh to exec the masked /bin/ls and fail with EACCES; the stand-in busybox is Debian's " +
			"busybox-static, whose sh runs applets in-process (FEATURE_SH_STANDALONE), so ls never reads /bin/ls"},
}

// critestUpstreams are the registries critest pulls from; each gets a hosts.toml that
// mirrors it to the test's registry, so that critest's image names stay as they are.
var critestUpstreams = []string{"registry.k8s.io", "gcr.io", "k8s.gcr.io"}

// TestE2EContainerdCritest runs critest, the CRI validation suite of cri-tools, through
// containerd 2.4.2's CRI socket once per runtime handler (containerd's runc, crisp's shim
// under containerd's podsandbox, crisp's shim as the sandboxer), each on a fresh
// containerd configured as TestE2EContainerd's is, and fails when a spec that passes on
// runc does not pass on one of crisp's handlers. critest's images are stand-ins built
// from Debian's busybox (critestImages says how each one matches upstream's), served
// by a registry in the test as mirrors of registry.k8s.io, gcr.io and k8s.gcr.io.
//
// Opt-in (CRISP_CRITEST=1; `make critest-containerd`): a run takes minutes per handler.
// CRISP_CRITEST_HANDLERS picks handlers (space separated; runc is what the others are
// compared with), CRISP_CRITEST_FOCUS is a --ginkgo.focus regexp, CRISP_CRITEST_OUT a
// directory that keeps critest's output and JSON report per handler.
func TestE2EContainerdCritest(t *testing.T) {
	if os.Getenv("CRISP_CRITEST") == "" {
		t.Skip("opt-in: CRISP_CRITEST=1 (make critest-containerd) runs critest through containerd per handler")
	}
	testutil.RequiresRoot(t, rootWhy)
	critest := filepath.Join(cachedBinDir(t, "CRITEST_CACHE", "/var/cache/crisp/critest-v"+critestVersion,
		"hack/critest.sh", "critest"), "critest")
	handlers := []string{"runc", "crisp-pod", "crisp-shim"}
	if h := strings.Fields(os.Getenv("CRISP_CRITEST_HANDLERS")); len(h) > 0 {
		handlers = h
	}
	out := os.Getenv("CRISP_CRITEST_OUT")
	if out == "" {
		out = t.TempDir()
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	images := critestImages(t)

	results := map[string]map[string]critestSpec{}
	for _, h := range handlers {
		t.Run(h, func(t *testing.T) {
			start := time.Now()
			res := runCritest(t, critest, h, images, out)
			results[h] = res
			logCritestResults(t, "on "+h, res, time.Since(start))
		})
	}

	base, ok := results["runc"]
	if !ok {
		return
	}
	for _, h := range handlers {
		res, ok := results[h]
		if h == "runc" || !ok {
			continue
		}
		for _, name := range sortedSpecs(base) {
			if base[name].kind() != "passed" {
				continue
			}
			if s, ok := res[name]; !ok {
				t.Errorf("%s: passes on runc, not run here: %s", h, name)
			} else if k := s.kind(); k != "passed" {
				t.Errorf("%s: passes on runc, %s here: %s\n      %s", h, k, name, s.reason())
			}
		}
		for _, name := range sortedSpecs(res) {
			if res[name].kind() == "passed" && base[name].kind() != "passed" {
				t.Logf("%s: passes here, not on runc: %s", h, name)
			}
		}
	}
}

// runCritest starts a containerd as TestE2EContainerd does, mirrors critest's
// registries to a registry holding critestImages, adds portmap to the pod network (the
// host port specs need it; the bridge, subnet and IPAM dir stay the harness's), runs
// critest on handler and returns its specs by name.
func runCritest(t *testing.T, critest, handler string, images map[string]v1.Image, out string) map[string]critestSpec {
	c := newContainerd(t)
	// The harness's directory is MkdirTemp's 0700; the mapped root of a user-namespaced
	// pod could not reach its rootfs below it (runc: remount-propagation ... permission
	// denied). containerd's own state dirs are 0711, as /run/containerd is.
	if err := os.Chmod(c.dir, 0o711); err != nil {
		t.Fatal(err)
	}
	host := imagetest.StartRegistry(t)
	for ref, img := range images {
		imagetest.Push(t, host, ref, img)
	}
	for _, up := range critestUpstreams {
		dir := filepath.Join(c.dir, "certs.d", up)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "https://"+up, "http://"+host)
		if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.addPortmap(t)

	report := filepath.Join(out, "critest-"+handler+".json")
	args := []string{
		"--runtime-endpoint", "unix://" + c.socket, "--image-endpoint", "unix://" + c.socket,
		"--runtime-handler", handler, "--config", filepath.Join(c.dir, "crictl.yaml"),
		"--ginkgo.no-color", "--ginkgo.timeout", "50m", "--ginkgo.json-report", report,
	}
	if f := os.Getenv("CRISP_CRITEST_FOCUS"); f != "" {
		args = append(args, "--ginkgo.focus", f)
	}
	res := execCritest(t, critest, c.dir, args, critestSkips, nil, filepath.Join(out, "critest-"+handler+".log"), report)
	// Whatever critest's specs did, nothing of their pods may stay behind.
	c.assertClean(t, 30*time.Second, nil)
	return res
}

// addPortmap rewrites the harness's CNI config with portmap chained after its bridge
// and waits until containerd has loaded it (its CRI status shows the config).
func (c *ctrd) addPortmap(t *testing.T) {
	t.Helper()
	path := filepath.Join(c.dir, "net.d", "10-ctrd.conflist")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	plugins, _ := conf["plugins"].([]any)
	conf["plugins"] = append(plugins, map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}})
	b, err = json.MarshalIndent(conf, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := c.rt.Status(ctx, &cri.StatusRequest{Verbose: true})
		cancel()
		if err == nil && strings.Contains(st.GetInfo()["cniconfig"], "portmap") && ctrdNetworkReady(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not load the CNI config with portmap: %v %v", st.GetInfo()["cniconfig"], err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pause39 is imagetest's pause image with a label of its own, so that its image ID
// differs from the harness's sandbox image.
func pause39(t *testing.T) v1.Image {
	t.Helper()
	layers, err := imagetest.PauseImage(t).Layers()
	if err != nil {
		t.Fatal(err)
	}
	return imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{
		Entrypoint: []string{"/pause"},
		Labels:     map[string]string{"org.opencontainers.image.version": "3.9"},
	}}, layers...)
}

// ipcsScript stands in for busybox's `ipcs -m`, which upstream's busybox image has and
// Debian's busybox-static lacks: the shared memory segments of the container's IPC
// namespace, from /proc/sysvipc/shm, in ipcs's columns (the host IPC specs look for
// the id of a segment made on the host).
const ipcsScript = `#!/bin/sh
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch     status"
tail -n +2 /proc/sysvipc/shm | while read key shmid perms size cpid lpid nattch uid rest; do
	printf '%-10s %-10s %-10s %-10s %-10s %-10s\n' "$key" "$shmid" "$uid" "$perms" "$size" "$nattch"
done
`

// pgrepScript stands in for busybox's `pgrep NAME` (missing in busybox-static too): the
// pids of the processes named NAME; critest checks with it that a timed-out exec's
// process is gone.
const pgrepScript = `#!/bin/sh
found=1
for d in /proc/[0-9]*; do
	if [ "$(cat "$d/comm" 2>/dev/null)" = "$1" ]; then
		echo "${d#/proc/}"
		found=0
	fi
done
exit $found
`

// nnpSource is Kubernetes' test/images/nonewprivs/nnp.c: installed setuid root, it
// shows whether no_new_privs kept the caller's uid.
const nnpSource = `#include <stdio.h>
#include <unistd.h>
int main(void) {
	printf("Effective uid: %d\n", geteuid());
	return 0;
}
`

// staticBinary compiles C source with gcc -static, as imagetest.PauseImage does pause.
func staticBinary(t *testing.T, name, source string) []byte {
	t.Helper()
	dir := t.TempDir()
	src, out := filepath.Join(dir, name+".c"), filepath.Join(dir, name)
	if err := os.WriteFile(src, []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("gcc", "-static", "-Os", "-s", "-o", out, src).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, b)
	}
	bin, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// shmSegments returns the ids of the host's System V shared memory segments.
func shmSegments() map[string]bool {
	ids := map[string]bool{}
	b, _ := os.ReadFile("/proc/sysvipc/shm")
	for i, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); i > 0 && len(f) > 1 {
			ids[f[1]] = true
		}
	}
	return ids
}

// critestImages returns stand-ins for the images critest v1.36 pulls, by their path
// below the mirrored registries (registry.k8s.io/pause:3.9 and k8s.gcr.io/pause:3.9
// are both "pause:3.9", one image, as upstream). Each has what critest checks of it:
//   - e2e-test-images/busybox:1.29-2: busybox with a shell (Debian's busybox-static).
//   - the k8s-staging-cri-tools test images (cri-tools' images/ directory): busybox,
//     with a file named after the image (test-image-tags:1..3 one image, as upstream
//     builds them), users as their Dockerfiles set them (1002, www-data, 1003:1004,
//     www-data:1004; test-image-predefined-group: uid 1000 in group 50000).
//   - e2e-test-images/nginx:1.14-2 and hostnet-nginx-amd64: busybox's httpd on port 80
//     (12003 for hostnet-nginx, its default.conf's port) run by a shell script named
//     nginx, so that `pidof nginx` finds it, which writes /var/run/nginx.pid and carries
//     "master process" in its arguments as nginx's process title does.
//   - e2e-test-images/nonewprivs:1.3: Kubernetes' nnp, setuid root, printing its
//     effective uid.
//   - pause:3.9: imagetest's pause, labelled so that it is not the harness's sandbox
//     image (critest counts the tags of the image it pulled from both registries).
//   - e2e-test-images/httpd:2.4.39-4: busybox's httpd on port 80 that logs a line
//     naming httpd to stdout.
func critestImages(t *testing.T) map[string]v1.Image {
	t.Helper()
	const (
		passwd = "root:x:0:0:root:/root:/bin/sh\n" +
			"daemon:x:1:1:daemon:/usr/sbin:/bin/false\n" +
			"www-data:x:33:33:www-data:/var/www:/bin/false\n" +
			"nobody:x:65534:65534:nobody:/home:/bin/false\n"
		group = "root:x:0:\ndaemon:x:1:\nwww-data:x:33:\nnogroup:x:65534:\n"
		path  = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	)
	// Upstream's busybox links its applets to /bin/busybox with hard links: a path masked
	// or made read-only is then the applet's own file, not the busybox a symlink leads to.
	var base []imagetest.TarEntry
	for _, e := range imagetest.BusyboxEntries(t) {
		switch {
		case e.Name == "etc/passwd" || e.Name == "etc/group":
		case e.Type == imagetest.TypeSymlink && e.Link == "busybox":
			// A hard link's header carries the file's mode, as docker's tars do: the
			// unpacker chmods the shared inode to it.
			l := imagetest.Hardlink(e.Name, "bin/busybox")
			l.Mode = 0o755
			base = append(base, l)
		default:
			base = append(base, e)
		}
	}
	base = append(base,
		imagetest.File("etc/passwd", passwd), imagetest.File("etc/group", group),
		imagetest.Dir("var"), imagetest.Dir("var/run"), imagetest.Dir("home"),
		imagetest.Dir("usr"), imagetest.Dir("usr/bin"),
		imagetest.Executable("usr/bin/ipcs", []byte(ipcsScript)),
		imagetest.Executable("usr/bin/pgrep", []byte(pgrepScript)))
	baseLayer := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, base...)
	image := func(cfg v1.Config, extra ...imagetest.TarEntry) v1.Image {
		cfg.Env = append([]string{path}, cfg.Env...)
		if len(cfg.Cmd) == 0 && len(cfg.Entrypoint) == 0 {
			cfg.Cmd = []string{"sh"}
		}
		layers := []v1.Layer{baseLayer}
		if len(extra) > 0 {
			layers = append(layers, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, extra...))
		}
		return imagetest.NewImage(t, imagetest.ImageOptions{Config: cfg}, layers...)
	}
	nginx := func(port int) v1.Image {
		script := fmt.Sprintf(`#!/bin/sh
# Stands in for nginx in critest's specs: busybox httpd serves /usr/share/nginx/html.
echo $$ > /var/run/nginx.pid
httpd -f -p %d -h /usr/share/nginx/html &
trap 'kill $!; exit 0' TERM INT QUIT
wait
`, port)
		return image(v1.Config{Cmd: []string{"/usr/sbin/nginx", "-g", "daemon off;", "master process"}},
			imagetest.Dir("usr/sbin"), imagetest.Dir("usr/share"),
			imagetest.Dir("usr/share/nginx"), imagetest.Dir("usr/share/nginx/html"),
			imagetest.File("usr/share/nginx/html/index.html", "<h1>Welcome to nginx!</h1>\n"),
			imagetest.Executable("usr/sbin/nginx", []byte(script)))
	}
	const stg = "k8s-staging-cri-tools/"
	imgs := map[string]v1.Image{
		"e2e-test-images/busybox:1.29-2": image(v1.Config{}),
		"pause:3.9":                      pause39(t),
		"e2e-test-images/nonewprivs:1.3": image(v1.Config{Cmd: []string{"/usr/local/bin/nnp"}},
			imagetest.Dir("usr/local"), imagetest.Dir("usr/local/bin"),
			imagetest.TarEntry{Type: imagetest.TypeFile, Name: "usr/local/bin/nnp", Body: staticBinary(t, "nnp", nnpSource), Mode: 0o4755}),
		"e2e-test-images/nginx:1.14-2":     nginx(80),
		stg + "hostnet-nginx-amd64:latest": nginx(12003),
		"e2e-test-images/httpd:2.4.39-4": image(v1.Config{Cmd: []string{"httpd-foreground"}},
			imagetest.Dir("usr/local"), imagetest.Dir("usr/local/bin"),
			imagetest.Dir("usr/local/apache2"), imagetest.Dir("usr/local/apache2/htdocs"),
			imagetest.File("usr/local/apache2/htdocs/index.html", "<html><body><h1>It works!</h1></body></html>\n"),
			imagetest.Executable("usr/local/bin/httpd-foreground", []byte(`#!/bin/sh
# Stands in for Apache httpd in critest's specs: busybox httpd on port 80.
echo "httpd: serving /usr/local/apache2/htdocs on port 80"
exec httpd -f -v -p 80 -h /usr/local/apache2/htdocs
`))),
		stg + "test-image-user-uid:latest":            image(v1.Config{User: "1002"}),
		stg + "test-image-user-username:latest":       image(v1.Config{User: "www-data"}),
		stg + "test-image-user-uid-group:latest":      image(v1.Config{User: "1003:1004"}),
		stg + "test-image-user-username-group:latest": image(v1.Config{User: "www-data:1004"}),
		stg + "test-image-predefined-group:latest": image(v1.Config{User: "1000"},
			imagetest.File("etc/passwd", passwd+"default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n"),
			imagetest.File("etc/group", group+"default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"),
			imagetest.Dir("home/default-user")),
	}
	for _, name := range []string{"test-image-1", "test-image-2", "test-image-3", "test-image-latest"} {
		imgs[stg+name+":latest"] = image(v1.Config{}, imagetest.File(name, ""))
	}
	same := image(v1.Config{}, imagetest.File("same-image", ""))
	for _, tag := range []string{"1", "2", "3"} {
		imgs[stg+"test-image-tags:"+tag] = same
	}
	tagged := image(v1.Config{}, imagetest.File("test-image-tag", ""))
	imgs[stg+"test-image-tag:test"] = tagged
	imgs[stg+"test-image-tag:all"] = tagged
	return imgs
}
