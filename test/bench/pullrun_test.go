//go:build bench

package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

var (
	pullFull   = flag.Bool("pull", false, "the full pull benchmark: ~200 MB images (gzip, zstd, whiteouts), 3 rounds, 10 pods of one cold image; without it a 20 MB gzip image, 1 round")
	pullSize   = flag.Int("pull-size", 0, "compressed MB of the generated pull images (default 20, 200 with -pull; 0 with -pull-rounds -1 skips the pull part)")
	pullRounds = flag.Int("pull-rounds", 0, "interleaved rounds of the pull benchmark (default 1, 3 with -pull; -1: no pull part)")
	pullImages = flag.String("pull-images", "", "comma-separated images to time: gzip, zstd, whiteout (default gzip, all with -pull)")
	pullPods   = flag.Int("pull-pods", -1, "pods of the one-cold-image case (default 0, 10 with -pull)")
	pullSeed   = flag.Uint64("pull-seed", 1, "seed of the generated pull images")
	pullOnly   = flag.String("pull-runtimes", "", "comma-separated columns to run (crisp, containerd-1.6, containerd-2.4-seq, containerd-2.4-par, floor, floor-seq; default all)")
	ctrd2Dir   = flag.String("containerd2", "/var/cache/crisp/containerd-v2.4.2/bin", "directory with containerd 2.x's containerd, containerd-shim-runc-v2 and runc (hack/containerd.sh builds them; empty: skip)")
)

// pullSettings resolves the pull flags' defaults: small in the default run, full
// with -pull.
func pullSettings() (size, rounds, pods int, images []string) {
	size, rounds, pods, images = 20, 1, 0, []string{"gzip"}
	if *pullFull {
		size, rounds, pods, images = 200, 3, 10, []string{"gzip", "zstd", "whiteout"}
	}
	if *pullSize > 0 {
		size = *pullSize
	}
	if *pullRounds != 0 {
		rounds = *pullRounds
	}
	if *pullPods >= 0 {
		pods = *pullPods
	}
	if *pullImages != "" {
		images = strings.Split(*pullImages, ",")
	}
	return size, rounds, pods, images
}

// blobLayer is a generated layer blob on disk as a v1.Layer, to push.
type blobLayer struct{ b GenBlob }

func (l blobLayer) Digest() (v1.Hash, error) { return v1.NewHash(l.b.Digest) }
func (l blobLayer) DiffID() (v1.Hash, error) { return v1.NewHash(l.b.DiffID) }
func (l blobLayer) Size() (int64, error)     { return l.b.Size, nil }
func (l blobLayer) MediaType() (types.MediaType, error) {
	return types.MediaType(l.b.MediaType()), nil
}
func (l blobLayer) Compressed() (io.ReadCloser, error) { return os.Open(l.b.Path) }
func (l blobLayer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.b.Path)
	if err != nil {
		return nil, err
	}
	var r io.Reader
	closeDecoder := func() {}
	if l.b.Compression == Zstd {
		zr, err := zstd.NewReader(f)
		if err != nil {
			f.Close()
			return nil, err
		}
		r, closeDecoder = zr, zr.Close
	} else if r, err = gzip.NewReader(f); err != nil {
		f.Close()
		return nil, err
	}
	return readCloser{r, func() error { closeDecoder(); return f.Close() }}, nil
}

// readCloser is a decoder over a file, closing both.
type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }

// pullRuntime is one runtime column of the pull benchmark.
type pullRuntime struct {
	col   string
	start func(context.Context, Spec) (*Daemon, error)
	spec  Spec
}

// pullSample is one timed pull's figures.
type pullSample struct {
	wall, wallSync, cpu time.Duration
	rssKB               float64
	written             int64
}

// runPull generates the images, pushes them to host, and times each runtime's pulls
// (each with an empty store: a daemon started on a fresh root for every timed pull),
// interleaved with the floors, over the rounds; then the cold-image pods.
func runPull(ctx context.Context, t *testing.T, host, pause, root string) (*PullReport, error) {
	size, rounds, pods, images := pullSettings()
	rep := &PullReport{SizeMB: size, Rounds: rounds, Cores: runtime.NumCPU(), Seed: *pullSeed}
	want := func(col string) bool {
		return *pullOnly == "" || strings.Contains(","+*pullOnly+",", ","+col+",")
	}

	busybox, err := os.ReadFile(imagetest.BusyboxPath)
	if err != nil {
		return nil, fmt.Errorf("%w (install Debian's busybox-static package)", err)
	}
	t0 := time.Now()
	tree := NewPullTree(*pullSeed, size, busybox)
	gens, err := tree.WriteImages(t.TempDir())
	if err != nil {
		return nil, fmt.Errorf("generate the pull images: %w", err)
	}
	t.Logf("pull: generated %d images of ~%d MB in %v", len(gens), size, time.Since(t0).Round(time.Millisecond))
	byName := map[string]GenImage{}
	refs := map[string]string{}
	for _, g := range gens {
		byName[g.Name] = g
	}
	for _, name := range images {
		g, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("-pull-images: no image %q (gzip, zstd, whiteout)", name)
		}
		var layers []v1.Layer
		var tarSize int64
		for _, b := range g.Layers {
			layers = append(layers, blobLayer{b})
			tarSize += b.TarSize
		}
		img := imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{
			Env: []string{"PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cmd: []string{"/bin/sleep", "3600"},
		}}, layers...)
		tag := fmt.Sprintf("pull-%s:s%d-%dmb", name, *pullSeed, size)
		imagetest.Push(t, host, tag, img)
		refs[name] = host + "/" + tag
		files := tree.Files(tree.Base)
		if name == "whiteout" {
			files += tree.Files(tree.Upper)
		}
		rep.Images = append(rep.Images, PullImageInfo{Name: name, MB: float64(g.Size()) / 1e6, TarMB: float64(tarSize) / 1e6, Layers: len(g.Layers), Files: files})
	}

	base := Spec{Bridge: fmt.Sprintf("benchpull%d", *instance), Subnet: subnet(*instance, 0), CgroupParent: "/bench-pull" + fmt.Sprint(*instance),
		Registry: host, PauseImage: pause, Bin: *binDir, Containerd2: *ctrd2Dir}
	var rts []pullRuntime
	add := func(col string, start func(context.Context, Spec) (*Daemon, error), unpacks int) {
		if !want(col) {
			return
		}
		s := base
		s.Name, s.Dir, s.Unpacks = col, filepath.Join(root, "p-"+col), unpacks
		rts = append(rts, pullRuntime{col, start, s})
	}
	add(PullCrisp, StartCrisp, 0)
	add(PullContainerd, StartContainerd, 0)
	if _, err := os.Stat(filepath.Join(*ctrd2Dir, "containerd")); *ctrd2Dir != "" && err == nil {
		add(PullCtrd2Seq, StartContainerd2, 1)
		add(PullCtrd2Par, StartContainerd2, runtime.NumCPU())
		if out, err := exec.Command(filepath.Join(*ctrd2Dir, "containerd"), "--version").Output(); err == nil {
			rep.Notes = append(rep.Notes, strings.TrimSpace(string(out)))
		}
	} else {
		rep.Notes = append(rep.Notes, fmt.Sprintf("containerd 2.x not measured: no %s/containerd (hack/containerd.sh builds it)", *ctrd2Dir))
	}
	if out, err := exec.Command("containerd", "--version").Output(); err == nil {
		rep.Notes = append(rep.Notes, strings.TrimSpace(string(out)))
	}
	gunzip := "pigz"
	if _, err := exec.LookPath("pigz"); err != nil {
		gunzip = "gzip"
		msg := "pigz is not installed (apt-get install pigz): the gzip floor uses gzip -dc, slower, and both containerds decompress in-process instead of with unpigz"
		t.Log("pull: WARNING: " + msg)
		rep.Notes = append(rep.Notes, msg)
	}
	rep.Notes = append(rep.Notes, "every timed pull starts its daemon on a fresh root (an empty store); the floors extract into a fresh directory and include a final sync, the runtimes' pull+unpack does not (their 'and sync' row does)")

	samples := map[string]map[string][]float64{}
	put := func(col, key string, v float64) {
		if samples[col] == nil {
			samples[col] = map[string][]float64{}
		}
		samples[col][key] = append(samples[col][key], v)
	}
	// The medians of what was measured, also when a later pull fails.
	defer func() {
		for col, keys := range samples {
			for key, vs := range keys {
				rep.Set(col, key, Median(vs))
			}
		}
	}()
	floorDir := filepath.Join(root, "floor")
	defer os.RemoveAll(floorDir)
	for round := range rounds {
		for _, name := range images {
			ref, g := refs[name], byName[name]
			// A different runtime goes first each round.
			order := append(append([]pullRuntime(nil), rts[round%max(1, len(rts)):]...), rts[:round%max(1, len(rts))]...)
			for _, rt := range order {
				if ctx.Err() != nil {
					return rep, ctx.Err()
				}
				s, err := timedPull(ctx, t, rt, ref)
				if err != nil {
					return rep, fmt.Errorf("%s: pull %s: %w", rt.col, name, err)
				}
				t.Logf("pull: round %d %s %s: %v (with sync %v), cpu %v, peak RSS %.0f MiB, wrote %d MiB", round+1, name, rt.col,
					s.wall.Round(time.Millisecond), s.wallSync.Round(time.Millisecond), s.cpu.Round(time.Millisecond), s.rssKB/1024, s.written>>20)
				put(rt.col, name+"_wall", ms(s.wall))
				put(rt.col, name+"_wall_sync", ms(s.wallSync))
				put(rt.col, name+"_cpu", ms(s.cpu))
				put(rt.col, name+"_rss", s.rssKB/1024)
				put(rt.col, name+"_written", float64(s.written)/(1<<20))
			}
			for _, f := range []struct {
				col      string
				parallel bool
			}{{PullFloor, true}, {PullFloorSeq, false}} {
				if !want(f.col) {
					continue
				}
				wall, cpu, err := floor(ctx, floorDir, g.Layers, f.parallel, gunzip)
				if err != nil {
					return rep, fmt.Errorf("%s of %s: %w", f.col, name, err)
				}
				t.Logf("pull: round %d %s %s: %v, cpu %v", round+1, name, f.col, wall.Round(time.Millisecond), cpu.Round(time.Millisecond))
				put(f.col, name+"_wall", ms(wall))
				put(f.col, name+"_cpu", ms(cpu))
			}
		}
	}

	if pods > 0 && len(images) > 0 {
		rep.Pods = pods
		ref := refs[images[0]]
		for _, rt := range rts {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			all, err := coldPods(ctx, t, rt, ref, pods)
			if err != nil {
				return rep, fmt.Errorf("%s: %d pods of one cold image: %w", rt.col, pods, err)
			}
			t.Logf("pull: %d pods of %s on %s: all running after %v", pods, images[0], rt.col, all.Round(time.Millisecond))
			rep.Set(rt.col, "pods10", ms(all))
		}
		rep.Notes = append(rep.Notes, fmt.Sprintf("pods row: %d clients each RunPodSandbox, PullImage (%s image), CreateContainer, StartContainer at once, one run each", pods, images[0]))
	}
	return rep, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// startFresh starts a runtime on an empty root; stop tears it down (defer it at once).
func startFresh(ctx context.Context, t *testing.T, rt pullRuntime) (d *Daemon, stop func(), err error) {
	if err := os.RemoveAll(rt.spec.Dir); err != nil {
		return nil, func() {}, err
	}
	if err := os.MkdirAll(rt.spec.Dir, 0o711); err != nil {
		return nil, func() {}, err
	}
	return startRuntime(ctx, t, rt.start, rt.spec)
}

// timedPull starts rt on an empty root, times one PullImage of ref and what the
// daemon used for it, then removes it all.
func timedPull(ctx context.Context, t *testing.T, rt pullRuntime, ref string) (s pullSample, err error) {
	d, stop, err := startFresh(ctx, t, rt)
	defer stop()
	if err != nil {
		return s, err
	}
	// What earlier work left dirty is written out now, not during the pull.
	syscall.Sync()
	pid := d.Pid()
	before, err := ReadProcSample(pid)
	if err != nil {
		return s, err
	}
	if err := ResetPeakRSS(pid); err != nil {
		return s, fmt.Errorf("reset peak RSS: %w", err)
	}
	t0 := time.Now()
	if _, err := d.Img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
		return s, fmt.Errorf("%w\n%s", err, d.LogTail())
	}
	s.wall = time.Since(t0)
	after, err := ReadProcSample(pid)
	if err != nil {
		return s, err
	}
	if s.rssKB, err = PeakRSS(pid); err != nil {
		return s, err
	}
	syscall.Sync()
	s.wallSync = time.Since(t0)
	s.cpu = after.CPU - before.CPU
	s.written = after.WriteBytes - before.WriteBytes
	st, err := d.Img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: ref}})
	if err != nil || st.Image == nil {
		return s, fmt.Errorf("image not there after its pull: %v", err)
	}
	return s, nil
}

// floor extracts every layer blob into a directory of its own with the fastest
// tools at hand (pigz -dc or zstd -dc into tar -x), all at once or one after
// another, then syncs; it returns the wall time and the CPU time of those processes.
func floor(ctx context.Context, dir string, blobs []GenBlob, parallel bool, gunzip string) (time.Duration, time.Duration, error) {
	if err := os.RemoveAll(dir); err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	cmds := make([]*exec.Cmd, len(blobs))
	for i, b := range blobs {
		sub := filepath.Join(dir, fmt.Sprint(i))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return 0, 0, err
		}
		dec := gunzip
		if b.Compression == Zstd {
			dec = "zstd"
		}
		cmds[i] = exec.CommandContext(ctx, "bash", "-c", `set -o pipefail; "$0" -dc "$1" | tar -x -C "$2"`, dec, b.Path, sub)
	}
	syscall.Sync()
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru0)
	t0 := time.Now()
	errs := make([]error, len(cmds))
	run := func(i int) {
		if out, err := cmds[i].CombinedOutput(); err != nil {
			errs[i] = fmt.Errorf("%v: %v %s", cmds[i].Args, err, out)
		}
	}
	if parallel {
		var wg sync.WaitGroup
		for i := range cmds {
			wg.Add(1)
			go func() { defer wg.Done(); run(i) }()
		}
		wg.Wait()
	} else {
		for i := range cmds {
			run(i)
		}
	}
	syscall.Sync()
	wall := time.Since(t0)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	return wall, cpu, errors.Join(errs...)
}

// coldPods starts rt on an empty root (the pause image pulled first), then has n
// clients at once each run a pod, pull ref, and create and start a `sleep` container
// of it, as kubelet's pod workers do after a scale-up; it returns the time until all
// run.
func coldPods(ctx context.Context, t *testing.T, rt pullRuntime, ref string, n int) (time.Duration, error) {
	d, stop, err := startFresh(ctx, t, rt)
	defer stop()
	if err != nil {
		return 0, err
	}
	if _, err := d.Img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: rt.spec.PauseImage}}); err != nil {
		return 0, fmt.Errorf("pull the pause image: %w", err)
	}
	syscall.Sync()
	w := &Workload{D: d, Image: ref}
	errs := make([]error, n)
	ids := make([]string, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pod := w.podConfig("cold")
			rp, err := d.RT.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod})
			if err != nil {
				errs[i] = fmt.Errorf("run pod: %w", err)
				return
			}
			if _, err := d.Img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}, SandboxConfig: pod}); err != nil {
				errs[i] = fmt.Errorf("pull: %w", err)
				return
			}
			ids[i], errs[i] = w.runCtr(ctx, rp.PodSandboxId, pod, w.ctrConfig("sleep", "/bin/sleep", "3600"))
		}()
	}
	wg.Wait()
	all := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("%w\n%s", err, d.LogTail())
	}
	for _, id := range ids {
		st, err := d.RT.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return 0, err
		}
		if st.Status.State != cri.ContainerState_CONTAINER_RUNNING {
			return 0, fmt.Errorf("container %s is %v, not running", id, st.Status.State)
		}
	}
	return all, nil
}
