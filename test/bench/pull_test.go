package bench

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// tarNames lists a blob's entries by name.
func tarNames(t *testing.T, b GenBlob) map[string]*tar.Header {
	t.Helper()
	f, err := os.Open(b.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader
	switch b.Compression {
	case Gzip:
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	case Zstd:
		zr, err := zstd.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		r = zr
	}
	out := map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", b.Path, err)
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

func TestPullImagesDeterministic(t *testing.T) {
	gen := func() []GenImage {
		imgs, err := NewPullTree(7, 4, []byte("busybox")).WriteImages(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return imgs
	}
	a, b := gen(), gen()
	if len(a) != 3 {
		t.Fatalf("got %d images", len(a))
	}
	for i := range a {
		for j := range a[i].Layers {
			if a[i].Layers[j].Digest != b[i].Layers[j].Digest {
				t.Errorf("image %s layer %d differs between two runs", a[i].Name, j)
			}
		}
	}
	// gzip and zstd hold the same trees.
	for j := range a[0].Layers {
		if a[0].Layers[j].DiffID != a[1].Layers[j].DiffID {
			t.Errorf("layer %d: gzip and zstd diff IDs differ", j)
		}
		if a[0].Layers[j].Digest == a[1].Layers[j].Digest {
			t.Errorf("layer %d: gzip and zstd blobs are the same", j)
		}
	}
	other, err := NewPullTree(8, 4, []byte("busybox")).WriteImages(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if other[0].Layers[1].Digest == a[0].Layers[1].Digest {
		t.Error("another seed made the same layer")
	}
}

func TestPullTreeShape(t *testing.T) {
	tr := NewPullTree(1, 200, []byte("busybox"))
	if n := len(tr.Base); n < 4 || n > 8 {
		t.Errorf("%d base layers, want 4-8", n)
	}
	if n := tr.Files(tr.Base); n < 23000 || n > 27000 {
		t.Errorf("%d files at full size, want ~25,000", n)
	}
	var small, large int
	var bytes int64
	for _, l := range tr.Base {
		for _, e := range l.Entries {
			bytes += e.Size
			switch {
			case e.Kind == kindBinary && e.Size >= 1<<20:
				large++
			case e.Kind == kindText:
				small++
			}
		}
	}
	if large < 5 || large > 30 || small < 20000 {
		t.Errorf("%d large and %d small files", large, small)
	}
	if mb := bytes >> 20; mb < 350 || mb > 800 {
		t.Errorf("%d MB uncompressed", mb)
	}
}

// TestPullWhiteoutImage checks the whiteout image deletes and replaces what is
// below it: every whiteout and opaque marker names something a lower layer has, and
// the deleted directory comes back in the layer above.
func TestPullWhiteoutImage(t *testing.T) {
	imgs, err := NewPullTree(3, 6, []byte("busybox")).WriteImages(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	wo := imgs[2]
	if wo.Name != "whiteout" || len(wo.Layers) != len(imgs[0].Layers)+2 {
		t.Fatalf("whiteout image %+v", wo.Name)
	}
	lower := map[string]bool{}
	for _, l := range imgs[0].Layers {
		for name := range tarNames(t, l) {
			lower[strings.TrimSuffix(name, "/")] = true
		}
	}
	del := tarNames(t, wo.Layers[len(wo.Layers)-2])
	var whiteouts, opaques int
	for name, h := range del {
		dir, base, _ := strings.Cut(name, ".wh.")
		switch {
		case base == ".wh..opq":
			opaques++
			if !lower[strings.TrimSuffix(dir, "/")] {
				t.Errorf("opaque dir %s is not in a lower layer", dir)
			}
		case strings.Contains(name, ".wh."):
			whiteouts++
			if !lower[dir+base] {
				t.Errorf("whiteout of %s, which no lower layer has", dir+base)
			}
			if h.Size != 0 {
				t.Errorf("whiteout %s has %d bytes", name, h.Size)
			}
		}
	}
	if whiteouts < 3 || opaques != 1 {
		t.Errorf("%d whiteouts, %d opaque dirs", whiteouts, opaques)
	}
	if _, ok := del[".wh.usr/share/doc"]; ok {
		t.Error("whiteout written at the wrong place")
	}
	if _, ok := del["usr/share/.wh.doc"]; !ok {
		t.Error("no whiteout of usr/share/doc")
	}
	if _, ok := del["opt/app/data/model.bin"]; !ok {
		t.Error("model.bin not replaced")
	}
	again := tarNames(t, wo.Layers[len(wo.Layers)-1])
	found := false
	for name := range again {
		found = found || strings.HasPrefix(name, "usr/share/doc/")
	}
	if !found {
		t.Error("usr/share/doc not made again above its whiteout")
	}
}

func TestPullText(t *testing.T) {
	tr := NewPullTree(1, 2, nil)
	b := tr.text(nil, 42, 100000)
	if len(b) != 100000 {
		t.Fatalf("%d bytes", len(b))
	}
	if !bytes.Equal(b, tr.text(nil, 42, 100000)) {
		t.Error("text not deterministic")
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	// Text-like: compresses, but not to nothing.
	if r := float64(len(b)) / float64(buf.Len()); r < 2 || r > 6 {
		t.Errorf("text compresses %.1f:1", r)
	}
	var bin bytes.Buffer
	if err := binaryContent(&bin, 1, 1<<20); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	zw = gzip.NewWriter(&buf)
	zw.Write(bin.Bytes())
	zw.Close()
	if r := float64(bin.Len()) / float64(buf.Len()); r < 1.3 || r > 4 {
		t.Errorf("binary compresses %.1f:1", r)
	}
}

func TestParseProcFigures(t *testing.T) {
	stat := "42 (containerd (x)) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 30 20 20 0 12 0 100 0"
	cpu, err := parseTotalCPU([]byte(stat))
	if err != nil || cpu != 2500*time.Millisecond {
		t.Errorf("parseTotalCPU = %v, %v; want 2.5s", cpu, err)
	}
	if _, err := parseTotalCPU([]byte("42 (x) S 1")); err == nil {
		t.Error("short stat accepted")
	}
	io := "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 5\nwrite_bytes: 8192\ncancelled_write_bytes: 4096\n"
	if w, err := parseWriteBytes([]byte(io)); err != nil || w != 4096 {
		t.Errorf("parseWriteBytes = %d, %v", w, err)
	}
	if _, err := parseWriteBytes([]byte("rchar: 1\n")); err == nil {
		t.Error("io without write_bytes accepted")
	}
	if v, err := parseStatusKB([]byte("Name:\tx\nVmHWM:\t  1234 kB\nVmRSS:\t 99 kB\n"), "VmHWM:"); err != nil || v != 1234 {
		t.Errorf("parseStatusKB = %v, %v", v, err)
	}
	self, err := ReadProcSample(os.Getpid())
	if err != nil || self.CPU <= 0 {
		t.Errorf("ReadProcSample(self) = %+v, %v", self, err)
	}
}

func TestPullReportTable(t *testing.T) {
	p := &PullReport{SizeMB: 200, Rounds: 3, Cores: 2, Seed: 1, Pods: 10,
		Images: []PullImageInfo{{Name: "gzip", MB: 201, TarMB: 560, Layers: 6, Files: 25000}}}
	p.Set(PullCrisp, "gzip_wall", 7300)
	p.Set(PullContainerd, "gzip_wall", 8600)
	p.Set(PullCtrd2Seq, "gzip_wall", 14400)
	p.Set(PullCtrd2Par, "gzip_wall", 13800)
	p.Set(PullFloor, "gzip_wall", 4000)
	p.Set(PullFloorSeq, "gzip_wall", 6300)
	p.Set(PullCrisp, "gzip_rss", 50)
	p.Set(PullContainerd, "gzip_rss", 60)
	p.Set(PullCtrd2Par, "gzip_rss", 40)
	p.Set(PullCrisp, "pods10", 3000)
	p.Set(PullContainerd, "pods10", 9000)
	var sb strings.Builder
	if err := p.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	lines := strings.Split(out, "\n")
	find := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				return l
			}
		}
		t.Fatalf("no row %q in\n%s", prefix, out)
		return ""
	}
	// 7300/8600 against the fastest containerd, 7300/4000 against the floor.
	wall := find("gzip: pull+unpack p50")
	for _, want := range []string{"0.85", "≤0.5 MISSED", "1.82", "≤1.3 MISSED", "7300", "4000", "6300"} {
		if !strings.Contains(wall, want) {
			t.Errorf("wall row lacks %q: %s", want, wall)
		}
	}
	// RSS: against the lowest containerd figure (40), so 1.25 misses ≤1.
	if rss := find("gzip: daemon peak RSS p50"); !strings.Contains(rss, "1.25") || !strings.Contains(rss, "MISSED") {
		t.Errorf("rss row: %s", rss)
	}
	if pods := find("10 pods"); !strings.Contains(pods, "0.33") || !strings.Contains(pods, "≤0.5 met") {
		t.Errorf("pods row: %s", pods)
	}
	// No figures, no row.
	if strings.Contains(out, "gzip: daemon CPU") {
		t.Errorf("empty row printed:\n%s", out)
	}
	if !strings.Contains(out, "25000 files") {
		t.Errorf("image line missing:\n%s", out)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{9, 1, 5}, 5}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
