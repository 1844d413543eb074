package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/diskspace"
	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/testutil/fulldisk"
)

// mountTmpfs mounts a tmpfs of size on dir (created if needed). The env's cleanup
// unmounts everything under its directory once criserver is stopped.
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fulldisk.MountNoCleanup(t, dir, "size="+size)
}

// withImageReserve appends the image store's free-space reserve to the env's config.
func (e *env) withImageReserve(minFreeBytes int64, minFreePercent float64) {
	e.t.Helper()
	e.appendConfig(fmt.Sprintf("[image]\nmin_free_bytes = %d\nmin_free_percent = %v\n", minFreeBytes, minFreePercent))
}

// assertImagesEmpty fails if anything of a failed pull is left under root/images: an
// image, a snapshot directory, a blob or an ingest file.
func (e *env) assertImagesEmpty(t *testing.T) {
	t.Helper()
	list, err := e.img.ListImages(ctxT(t), &cri.ListImagesRequest{})
	if err != nil {
		t.Fatalf("ListImages after a failed pull: %v", err)
	}
	if len(list.Images) != 0 {
		t.Errorf("ListImages after a failed pull: %v", list.Images)
	}
	for _, dir := range []string{"snapshots", "content/ingest", "content/blobs/sha256"} {
		entries, err := os.ReadDir(filepath.Join(e.root, "images", dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, en := range entries {
			t.Errorf("left under images/%s: %s", dir, en.Name())
		}
	}
}

// TestE2EDiskFull: a full image or log filesystem is a clean error for the request
// that meets it, criserver keeps serving, and everything works again once there is
// space.
func TestE2EDiskFull(t *testing.T) {
	t.Run("reserve", testDiskFullReserve)
	t.Run("enospc", testDiskFullENOSPC)
	t.Run("logs", testDiskFullLogs)
}

// testDiskFullReserve: a 2 MB gzip layer that unpacks to 2 GiB, pulled onto a 1 GiB
// image filesystem that must keep 768 MiB free, is refused with ResourceExhausted
// naming the image and the space once the reserve is reached, nothing of it stays,
// and with a larger filesystem the same pull succeeds.
func testDiskFullReserve(t *testing.T) {
	e := newEnv(t)
	const reserve = 768 << 20
	images := filepath.Join(e.root, "images")
	mountTmpfs(t, images, "1g")
	e.withImageReserve(reserve, 0)
	e.start()
	ctx := ctxT(t)

	start := time.Now()
	bomb := imagetest.ZerosLayer(t, imagetest.OCI, "zeros", 2<<30)
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, bomb)
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "bomb:v1", img)
	ref := host + "/bomb:v1"
	t.Logf("built and pushed a %d byte gzip layer of 2 GiB of zeros in %v", len(bomb.Blob()), time.Since(start))

	before, err := diskspace.Stat(images)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	low := fulldisk.LowestFree(images, stop)
	start = time.Now()
	_, err = e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}})
	took := time.Since(start)
	close(stop)
	lowest := <-low
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("pull of a layer unpacking to 2 GiB onto 1 GiB with a 768 MiB reserve: %v, want ResourceExhausted", err)
	}
	for _, want := range []string{ref, images, "free", "must keep 768 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q: %v", want, err)
		}
	}
	t.Logf("refused after %v; %d MiB written before the refusal (free %d MiB, lowest %d MiB, reserve 768 MiB): %v",
		took, (before.Free-lowest)>>20, before.Free>>20, lowest>>20, status.Convert(err).Message())
	if lowest < reserve-diskspace.CheckEvery-(1<<20) {
		t.Errorf("free space went down to %d MiB, below the reserve by more than one check interval", lowest>>20)
	}
	e.assertImagesEmpty(t)

	fulldisk.Resize(t, images, "3g")
	start = time.Now()
	resp, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatalf("pull with room for the layer: %v", err)
	}
	t.Logf("the same pull on a 3 GiB filesystem: %v", time.Since(start))
	if resp.ImageRef != imagetest.ConfigDigest(t, img).String() {
		t.Errorf("pulled %s", resp.ImageRef)
	}
	if _, err := e.img.RemoveImage(ctx, &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
		t.Errorf("remove: %v", err)
	}
}

// testDiskFullENOSPC: with no reserve, a 32 MiB image filesystem fills up during a
// download and during an unpack; each pull fails with ResourceExhausted, leaves
// nothing, criserver keeps answering, and once there is space both pulls succeed.
func testDiskFullENOSPC(t *testing.T) {
	e := newEnv(t)
	images := filepath.Join(e.root, "images")
	mountTmpfs(t, images, "32m")
	e.withImageReserve(0, 0)
	e.start()
	ctx := ctxT(t)

	host := imagetest.StartRegistry(t)
	base := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("etc/hello", "world"))
	imagetest.Push(t, host, "download:v1", imagetest.NewImage(t, imagetest.ImageOptions{}, base,
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("random", 48<<20, 9))))
	imagetest.Push(t, host, "unpack:v1", imagetest.NewImage(t, imagetest.ImageOptions{}, base,
		imagetest.ZerosLayer(t, imagetest.OCI, "zeros", 64<<20)))

	for _, name := range []string{"download:v1", "unpack:v1"} {
		ref := host + "/" + name
		start := time.Now()
		_, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}})
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "is full") || !strings.Contains(err.Error(), ref) {
			t.Fatalf("pull %s onto a full filesystem: %v, want ResourceExhausted naming it and saying the filesystem is full", name, err)
		}
		t.Logf("pull %s failed after %v: %s", name, time.Since(start), status.Convert(err).Message())
		e.assertImagesEmpty(t)
		if _, err := e.rt.Version(ctx, &cri.VersionRequest{}); err != nil {
			t.Fatalf("criserver after a full disk: %v", err)
		}
	}
	fulldisk.Resize(t, images, "256m")
	for _, name := range []string{"download:v1", "unpack:v1"} {
		if _, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: host + "/" + name}}); err != nil {
			t.Fatalf("pull %s after space was freed: %v", name, err)
		}
	}
	list, err := e.img.ListImages(ctx, &cri.ListImagesRequest{})
	if err != nil || len(list.Images) != 2 {
		t.Fatalf("ListImages after the pulls: %v, %v", list, err)
	}
}

var lineNumber = regexp.MustCompile(`^stdout line (\d+) `)

// lastLineNumber returns the number of the last "line N" record of the log at path
// (0 when there is none); every line must be a whole CRI record.
func lastLineNumber(t *testing.T, path string) int {
	t.Helper()
	lines := logLines(t, path)
	for i := len(lines) - 1; i >= 0; i-- {
		if m := lineNumber.FindStringSubmatch(lines[i]); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	return 0
}

// testDiskFullLogs: a container whose log directory is on a full filesystem keeps
// running at full speed (its output pipe is drained, its lines dropped and counted),
// ExecSync still works, and once space is freed its new lines appear in the log.
func testDiskFullLogs(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	image := e.busybox(ctx)
	pod := e.podConfig("logfull")
	mountTmpfs(t, pod.LogDirectory, "4m")
	podID := e.runPod(ctx, pod)
	// About 1000 lines of 220 bytes a second: a blocked pipe (64 KiB) would stop the
	// loop within a third of a second.
	script := `p=$(printf '%0200d' 0); i=0; while :; do i=$((i+1)); echo "line $i $p"; echo $i > /tmp/count; usleep 1000; done`
	ctrID := e.runCtr(ctx, podID, pod, ctrConfig("talker", image, "sh", "-c", script))
	logPath := filepath.Join(pod.LogDirectory, "talker.log")
	count := func() int {
		t.Helper()
		// The shell truncates /tmp/count before writing it: a read may find it empty.
		for try := 0; ; try++ {
			resp, err := e.execSync(ctx, ctrID, 10, "cat", "/tmp/count")
			if err != nil || resp.ExitCode != 0 {
				t.Fatalf("ExecSync with the log disk full: %v %v", resp, err)
			}
			n, err := strconv.Atoi(strings.TrimSpace(string(resp.Stdout)))
			if err == nil {
				return n
			}
			if try == 10 {
				t.Fatalf("count %q: %v", resp.Stdout, err)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for lastLineNumber(t, logPath) < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("the container logged nothing; log: %v", logLines(t, logPath))
		}
		time.Sleep(50 * time.Millisecond)
	}

	fulldisk.Fill(t, filepath.Join(pod.LogDirectory, "filler"))
	time.Sleep(200 * time.Millisecond) // let what was in flight fail
	lastBefore := lastLineNumber(t, logPath)
	// A blocked pipe (64 KiB) holds ~297 of its lines: past 400 more it is drained. On
	// a loaded machine the loop may print far fewer than its 1000 lines a second, so
	// the test waits for them rather than counting a fixed window.
	c1 := count()
	const enough, within = 400, 30 * time.Second
	waited := time.Now()
	c2 := c1
	for c2-c1 < enough {
		if time.Since(waited) > within {
			t.Fatalf("with the log disk full the container printed only %d lines in %v: it is blocked", c2-c1, within)
		}
		time.Sleep(250 * time.Millisecond)
		c2 = count()
	}
	took := time.Since(waited)
	if got := lastLineNumber(t, logPath); got != lastBefore {
		t.Errorf("the log grew on a full disk: last line %d, then %d", lastBefore, got)
	}
	st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ctrID})
	if err != nil || st.Status.State != cri.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("container with a full log disk: %v %v", st, err)
	}
	t.Logf("log disk full: the container went on from line %d to %d in %v (%.0f lines/s, none written)",
		c1, c2, took.Round(time.Millisecond), float64(c2-c1)/took.Seconds())

	if err := os.Remove(filepath.Join(pod.LogDirectory, "filler")); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	deadline = freed.Add(10 * time.Second)
	for {
		if n := lastLineNumber(t, logPath); n > c2 {
			t.Logf("space freed: line %d in the log after %v; lines %d to about %d were dropped",
				n, time.Since(freed).Round(time.Millisecond), lastBefore+1, c2)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new log lines within 10s of freeing space; last is %d", lastLineNumber(t, logPath))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if logs := logLinesWith(e.shimLogs(), "container log not written", "container log written again"); !strings.Contains(logs, "dropped_lines") ||
		!strings.Contains(logs, "container log written again") {
		t.Errorf("the shim log does not report the dropped lines:\n%s", logs)
	} else {
		t.Logf("shim reports:\n%s", logs)
	}
}
