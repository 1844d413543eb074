package bench

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// The pull benchmark's images are generated: a realistic shape (many small text-like
// files, a few large partly compressible ones, 4-8 layers) that is the same for the
// same seed and size on every run, so runs compare.

// entryKind is the kind of a generated tar entry.
type entryKind int

const (
	kindDir entryKind = iota
	kindText
	kindBinary
	kindBytes // Body as given (busybox)
	kindSymlink
	kindWhiteout
	kindOpaque
)

// genEntry is one entry of a generated layer: its content is made from Seed when the
// layer is written, so a tree of 25,000 files costs only its metadata until then.
type genEntry struct {
	Kind entryKind
	// Name is the path in the layer; for kindWhiteout the path deleted, for
	// kindOpaque the directory made opaque.
	Name string
	Size int64
	Seed uint64
	Link string
	Body []byte
	Mode int64
}

// genLayer is one generated layer.
type genLayer struct {
	Name    string
	Entries []genEntry
}

// layerBuilder adds entries to a layer, each parent directory once, before its
// first child.
type layerBuilder struct {
	l    genLayer
	dirs map[string]bool
	seed uint64
	n    uint64
}

func newLayerBuilder(name string, seed uint64) *layerBuilder {
	return &layerBuilder{l: genLayer{Name: name}, dirs: map[string]bool{}, seed: seed}
}

func (b *layerBuilder) dir(p string) {
	if p == "." || p == "" || b.dirs[p] {
		return
	}
	b.dir(path.Dir(p))
	b.dirs[p] = true
	b.l.Entries = append(b.l.Entries, genEntry{Kind: kindDir, Name: p, Mode: 0o755})
}

func (b *layerBuilder) add(e genEntry) {
	b.dir(path.Dir(e.Name))
	if e.Kind == kindText || e.Kind == kindBinary {
		b.n++
		e.Seed = b.seed*1_000_003 + b.n
	}
	b.l.Entries = append(b.l.Entries, e)
}

// vocabulary is the words text files and path names are made of: n pseudo-words of
// 2-12 letters, a few of them very common, as in source code and prose.
func vocabulary(seed uint64, n int) []string {
	r := rand.New(rand.NewPCG(seed, 0x766f6361))
	out := make([]string, n)
	seen := map[string]bool{}
	for i := range out {
		for {
			l := 2 + r.IntN(6) + r.IntN(6)
			b := make([]byte, l)
			for j := range b {
				b[j] = "etaoinshrdlucmfwypvbgkjqxz"[min(25, int(r.ExpFloat64()*5))]
			}
			if !seen[string(b)] {
				seen[string(b)] = true
				out[i] = string(b)
				break
			}
		}
	}
	return out
}

// PullTree is the content of the pull benchmark's images.
type PullTree struct {
	// Base are the layers of the gzip and zstd images, bottom first.
	Base []genLayer
	// Upper are the layers the whiteout image adds on top of Base: whiteouts of files
	// and of a whole directory, an opaque directory refilled, a large file replaced,
	// and a deleted directory made again.
	Upper []genLayer
	vocab []string
}

// pullShape is the full-size tree (scale 1, ~200 MB compressed): text files per
// layer and directory, and the large binary files (MB at full size).
var pullShape = struct {
	locales, perl, goSrc, goNet, docs, config int
	libs, goBins, app                         []struct {
		name string
		mb   float64
	}
}{
	locales: 3000, perl: 8000, goSrc: 10800, goNet: 200, docs: 3000, config: 20,
	libs: []struct {
		name string
		mb   float64
	}{{"usr/lib/x86_64-linux-gnu/libc.so.6", 2}, {"usr/lib/x86_64-linux-gnu/libstdc++.so.6", 2.4}, {"usr/lib/x86_64-linux-gnu/libcrypto.so.3", 4.5}, {"usr/lib/x86_64-linux-gnu/libperl.so.5.36", 3.8}, {"usr/lib/x86_64-linux-gnu/libicudata.so.72", 7.5}},
	goBins: []struct {
		name string
		mb   float64
	}{{"usr/local/go/bin/go", 14}, {"usr/local/go/bin/gofmt", 3.2}, {"usr/local/go/pkg/tool/linux_amd64/compile", 25}, {"usr/local/go/pkg/tool/linux_amd64/link", 7}, {"usr/local/go/pkg/tool/linux_amd64/vet", 9}, {"usr/local/go/pkg/tool/linux_amd64/asm", 5}, {"usr/local/go/pkg/tool/linux_amd64/cgo", 5}, {"usr/local/go/pkg/tool/linux_amd64/cover", 5.5}, {"usr/local/go/pkg/tool/linux_amd64/trace", 12}},
	app: []struct {
		name string
		mb   float64
	}{{"opt/app/data/model.bin", 70}, {"opt/app/data/assets.pak", 40}, {"opt/app/bin/server", 22}},
}

// NewPullTree returns the tree of size about sizeMB compressed (200 is the full
// size), the same for the same seed and size. busybox is the static binary put at
// /bin/busybox (with sh and sleep linked to it) so that containers can run.
func NewPullTree(seed uint64, sizeMB int, busybox []byte) *PullTree {
	s := float64(sizeMB) / 200
	count := func(n int) int { return max(1, int(float64(n)*s+0.5)) }
	mb := func(m float64) int64 { return max(4096, int64(m*s*(1<<20))) }
	vocab := vocabulary(seed, 4000)
	r := rand.New(rand.NewPCG(seed, 0x74726565))
	// textSize is log-normal around 4 KiB (mean ~7 KiB), capped: source files, docs.
	textSize := func() int64 {
		return min(256<<10, max(16, int64(math.Exp(8.3+r.NormFloat64()))))
	}
	word := func() string { return vocab[r.IntN(200)] }
	// texts adds n text files under root, ~25 a directory two levels down.
	texts := func(b *layerBuilder, root, ext string, n int) {
		var d string
		for i := range n {
			if i%25 == 0 {
				d = root + "/" + word() + "/" + word() + strconv.Itoa(i/25)
			}
			b.add(genEntry{Kind: kindText, Name: fmt.Sprintf("%s/%s_%d%s", d, word(), i%25, ext), Size: textSize(), Mode: 0o644})
		}
	}
	bins := func(b *layerBuilder, list []struct {
		name string
		mb   float64
	}) {
		for _, f := range list {
			b.add(genEntry{Kind: kindBinary, Name: f.name, Size: mb(f.mb), Mode: 0o755})
		}
	}

	t := &PullTree{vocab: vocab}
	base := newLayerBuilder("base", seed*16+1)
	base.add(genEntry{Kind: kindBytes, Name: "bin/busybox", Body: busybox, Mode: 0o755})
	for _, a := range []string{"sh", "sleep", "ls", "cat", "true"} {
		base.add(genEntry{Kind: kindSymlink, Name: "bin/" + a, Link: "busybox"})
	}
	for _, d := range []string{"dev", "proc", "sys", "tmp", "root"} {
		base.dir(d)
	}
	base.add(genEntry{Kind: kindBytes, Name: "etc/passwd", Body: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"), Mode: 0o644})
	base.add(genEntry{Kind: kindBytes, Name: "etc/group", Body: []byte("root:x:0:\nnogroup:x:65534:\n"), Mode: 0o644})
	bins(base, pullShape.libs)
	texts(base, "usr/share/locale", ".po", count(pullShape.locales))

	perl := newLayerBuilder("perl", seed*16+2)
	texts(perl, "usr/share/perl/5.36", ".pm", count(pullShape.perl))

	goLayer := newLayerBuilder("go", seed*16+3)
	bins(goLayer, pullShape.goBins)
	texts(goLayer, "usr/local/go/src", ".go", count(pullShape.goSrc))
	for i := range count(pullShape.goNet) {
		goLayer.add(genEntry{Kind: kindText, Name: fmt.Sprintf("usr/local/go/src/net/%s_%d.go", word(), i), Size: textSize(), Mode: 0o644})
	}

	docs := newLayerBuilder("docs", seed*16+4)
	texts(docs, "usr/share/doc", ".txt", count(pullShape.docs))

	app := newLayerBuilder("app", seed*16+5)
	bins(app, pullShape.app)

	config := newLayerBuilder("config", seed*16+6)
	texts(config, "etc/app", ".conf", count(pullShape.config))
	t.Base = []genLayer{base.l, perl.l, goLayer.l, docs.l, app.l, config.l}

	// The whiteout image's layers: deletions and replacements of lower content.
	del := newLayerBuilder("delete", seed*16+7)
	del.add(genEntry{Kind: kindWhiteout, Name: "usr/share/doc"})
	del.add(genEntry{Kind: kindWhiteout, Name: "opt/app/data/assets.pak"})
	n := 0
	for _, e := range perl.l.Entries {
		if e.Kind == kindText && n < count(100) {
			del.add(genEntry{Kind: kindWhiteout, Name: e.Name})
			n++
		}
	}
	del.add(genEntry{Kind: kindOpaque, Name: "usr/local/go/src/net"})
	for i := range count(pullShape.goNet / 4) {
		del.add(genEntry{Kind: kindText, Name: fmt.Sprintf("usr/local/go/src/net/new_%d.go", i), Size: textSize(), Mode: 0o644})
	}
	del.add(genEntry{Kind: kindBinary, Name: "opt/app/data/model.bin", Size: mb(8), Mode: 0o644})
	again := newLayerBuilder("recreate", seed*16+8)
	texts(again, "usr/share/doc", ".txt", count(50))
	t.Upper = []genLayer{del.l, again.l}
	return t
}

// Files counts the regular files and symlinks of layers.
func (t *PullTree) Files(layers []genLayer) int {
	n := 0
	for _, l := range layers {
		for _, e := range l.Entries {
			switch e.Kind {
			case kindText, kindBinary, kindBytes, kindSymlink:
				n++
			}
		}
	}
	return n
}

// pullEpoch is every entry's mtime, so the same tree makes the same bytes.
var pullEpoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// writeTar writes layer l as a tar stream.
func (t *PullTree) writeTar(w io.Writer, l genLayer) error {
	tw := tar.NewWriter(w)
	buf := make([]byte, 0, 1<<20)
	for _, e := range l.Entries {
		hdr := &tar.Header{Name: e.Name, Mode: e.Mode, ModTime: pullEpoch, Format: tar.FormatPAX}
		var body []byte
		switch e.Kind {
		case kindDir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, e.Name+"/"
		case kindSymlink:
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, e.Link, 0o777
		case kindWhiteout:
			dir, base := path.Split(e.Name)
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeReg, dir+".wh."+base, 0o644
		case kindOpaque:
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeReg, e.Name+"/.wh..wh..opq", 0o644
		case kindBytes:
			hdr.Typeflag, hdr.Size, body = tar.TypeReg, int64(len(e.Body)), e.Body
		case kindText, kindBinary:
			hdr.Typeflag, hdr.Size = tar.TypeReg, e.Size
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("tar header %s: %w", hdr.Name, err)
		}
		switch e.Kind {
		case kindText:
			buf = t.text(buf[:0], e.Seed, int(e.Size))
			body = buf
		case kindBinary:
			if err := binaryContent(tw, e.Seed, e.Size); err != nil {
				return err
			}
		}
		if body != nil {
			if _, err := tw.Write(body); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// text appends size bytes of pseudo-text: lines of words drawn with a Zipf law from
// the vocabulary, some indented, which compress about as source code and prose do.
func (t *PullTree) text(b []byte, seed uint64, size int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x74657874))
	z := rand.NewZipf(r, 1.1, 2, uint64(len(t.vocab)-1))
	for len(b) < size {
		if r.IntN(3) == 0 {
			b = append(b, "\t\t"[:1+r.IntN(2)]...)
		}
		for n := 3 + r.IntN(9); n > 0; n-- {
			b = append(b, t.vocab[z.Uint64()]...)
			b = append(b, " ();,."[r.IntN(6)])
		}
		b = append(b, '\n')
	}
	return b[:size]
}

// binaryContent writes size bytes like an executable or a data file: 4 KiB blocks,
// some random, some of a few byte values (code, tables), some zeros, so that gzip
// halves them about.
func binaryContent(w io.Writer, seed uint64, size int64) error {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	c := rand.NewChaCha8(key)
	r := rand.New(rand.NewPCG(seed, 0x62696e))
	block := make([]byte, 64<<10)
	for size > 0 {
		n := min(int64(len(block)), size)
		b := block[:n]
		for off := 0; off < len(b); off += 4096 {
			p := b[off:min(off+4096, len(b))]
			switch k := r.IntN(20); {
			case k < 6:
				_, _ = c.Read(p)
			case k < 15:
				_, _ = c.Read(p)
				for i := range p {
					p[i] &= 0x0f
				}
			default:
				clear(p)
			}
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		size -= n
	}
	return nil
}

// Compression names of generated blobs.
const (
	Gzip = "gzip"
	Zstd = "zstd"
)

// GenBlob is a generated layer blob on disk.
type GenBlob struct {
	Path        string
	Compression string
	// Digest is the blob's, DiffID its tar stream's (sha256:...).
	Digest, DiffID string
	Size           int64
	// TarSize is the uncompressed size.
	TarSize int64
}

// MediaType is the blob's OCI layer media type.
func (b GenBlob) MediaType() string {
	if b.Compression == Zstd {
		return "application/vnd.oci.image.layer.v1.tar+zstd"
	}
	return "application/vnd.oci.image.layer.v1.tar+gzip"
}

// GenImage is one generated image: its layer blobs, bottom first.
type GenImage struct {
	Name   string
	Layers []GenBlob
}

// Size is the sum of the compressed layers.
func (g GenImage) Size() int64 {
	var n int64
	for _, l := range g.Layers {
		n += l.Size
	}
	return n
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// writeBlob writes layer l compressed with comp to file p.
func (t *PullTree) writeBlob(p string, l genLayer, comp string) (GenBlob, error) {
	f, err := os.Create(p)
	if err != nil {
		return GenBlob{}, err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	blobHash, tarHash := sha256.New(), sha256.New()
	blobCount, tarCount := &countWriter{}, &countWriter{}
	out := io.MultiWriter(bw, blobHash, blobCount)
	var zw io.WriteCloser
	switch comp {
	case Gzip:
		// The default level, as docker and buildkit push.
		zw, err = gzip.NewWriterLevel(out, gzip.DefaultCompression)
	case Zstd:
		zw, err = zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	default:
		err = fmt.Errorf("unknown compression %q", comp)
	}
	if err != nil {
		return GenBlob{}, err
	}
	if err := t.writeTar(io.MultiWriter(zw, tarHash, tarCount), l); err != nil {
		return GenBlob{}, fmt.Errorf("layer %s: %w", l.Name, err)
	}
	if err := zw.Close(); err != nil {
		return GenBlob{}, err
	}
	if err := bw.Flush(); err != nil {
		return GenBlob{}, err
	}
	if err := f.Close(); err != nil {
		return GenBlob{}, err
	}
	return GenBlob{Path: p, Compression: comp, Size: blobCount.n, TarSize: tarCount.n,
		Digest: "sha256:" + hex.EncodeToString(blobHash.Sum(nil)), DiffID: "sha256:" + hex.EncodeToString(tarHash.Sum(nil))}, nil
}

// WriteImages writes the blobs of the three images into dir, layers in parallel (one
// a core): "gzip" and "zstd" (Base, each compressed so), and "whiteout" (the gzip
// Base and Upper, gzip).
func (t *PullTree) WriteImages(dir string) ([]GenImage, error) {
	type job struct {
		l    genLayer
		comp string
		out  *GenBlob
	}
	imgs := []GenImage{
		{Name: "gzip", Layers: make([]GenBlob, len(t.Base))},
		{Name: "zstd", Layers: make([]GenBlob, len(t.Base))},
		{Name: "whiteout", Layers: make([]GenBlob, len(t.Base)+len(t.Upper))},
	}
	var jobs []job
	for i, l := range t.Base {
		jobs = append(jobs, job{l, Gzip, &imgs[0].Layers[i]}, job{l, Zstd, &imgs[1].Layers[i]})
	}
	for i, l := range t.Upper {
		jobs = append(jobs, job{l, Gzip, &imgs[2].Layers[len(t.Base)+i]})
	}
	// Largest first, so the last job to start is a short one.
	size := func(l genLayer) (n int64) {
		for _, e := range l.Entries {
			n += e.Size
		}
		return n
	}
	for i := range jobs {
		for j := i + 1; j < len(jobs); j++ {
			if size(jobs[j].l) > size(jobs[i].l) {
				jobs[i], jobs[j] = jobs[j], jobs[i]
			}
		}
	}
	sem := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	errs := make([]error, len(jobs))
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			*j.out, errs[i] = t.writeBlob(filepath.Join(dir, j.l.Name+"."+j.comp), j.l, j.comp)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	copy(imgs[2].Layers, imgs[0].Layers)
	return imgs, nil
}

// ProcSample is what a process used so far: CPU (its own and its reaped children's,
// such as containerd's unpigz) and bytes it caused to be written.
type ProcSample struct {
	CPU time.Duration
	// WriteBytes is /proc/PID/io write_bytes less cancelled_write_bytes: the bytes
	// the process dirtied in the page cache, counted when dirtied (writeback by the
	// kernel's flusher is not charged elsewhere), whether or not they reached the
	// disk yet. It misses metadata and journal writes (jbd2's) and what other
	// processes (shims, a registry) write.
	WriteBytes int64
}

// ReadProcSample reads a process's ProcSample.
func ReadProcSample(pid int) (ProcSample, error) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcSample{}, err
	}
	cpu, err := parseTotalCPU(st)
	if err != nil {
		return ProcSample{}, err
	}
	io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return ProcSample{}, err
	}
	w, err := parseWriteBytes(io)
	return ProcSample{CPU: cpu, WriteBytes: w}, err
}

// parseTotalCPU is utime+stime+cutime+cstime of a /proc/PID/stat.
func parseTotalCPU(stat []byte) (time.Duration, error) {
	f, err := statFields(stat, 15)
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, s := range f[11:15] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat field %q: %w", s, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

func parseWriteBytes(io []byte) (int64, error) {
	var w, c int64
	found := 0
	for _, line := range strings.Split(string(io), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "write_bytes":
			w, found = n, found+1
		case "cancelled_write_bytes":
			c, found = n, found+1
		}
	}
	if found != 2 {
		return 0, errors.New("io lacks write_bytes or cancelled_write_bytes")
	}
	return w - c, nil
}

// ResetPeakRSS resets a process's VmHWM to its current RSS.
func ResetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// PeakRSS is a process's VmHWM in KiB: its peak RSS since it started or since
// ResetPeakRSS.
func PeakRSS(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusKB(b, "VmHWM:")
}

func parseStatusKB(status []byte, key string) (float64, error) {
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return strconv.ParseFloat(f[0], 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s in status", key)
}

// The columns of the pull report: the runtimes, then the floors.
const (
	PullCrisp       = "crisp"
	PullContainerd  = "containerd-1.6"
	PullCtrd2Seq    = "containerd-2.4-seq"
	PullCtrd2Par    = "containerd-2.4-par"
	PullFloor       = "floor"
	PullFloorSeq    = "floor-seq"
	pullContainerds = "containerd" // prefix of every containerd column
)

// PullColumns are the report's columns in order.
var PullColumns = []string{PullCrisp, PullContainerd, PullCtrd2Seq, PullCtrd2Par, PullFloor, PullFloorSeq}

// PullMetric is one row kind of the pull report, per image.
type PullMetric struct {
	Key, Name, Unit string
	// Target is crisp's ratio to the best containerd figure to meet (≤); 0 for none.
	Target float64
	// FloorTarget is crisp's ratio to the floor to meet (≤); 0 for none.
	FloorTarget float64
}

// PullMetrics are the rows of each image.
var PullMetrics = []PullMetric{
	{Key: "wall", Name: "pull+unpack p50", Unit: "ms", Target: 0.5, FloorTarget: 1.3},
	{Key: "wall_sync", Name: "  and sync p50", Unit: "ms"},
	{Key: "cpu", Name: "  daemon CPU p50", Unit: "ms"},
	{Key: "rss", Name: "  daemon peak RSS p50", Unit: "MiB", Target: 1},
	{Key: "written", Name: "  daemon bytes written p50", Unit: "MiB"},
}

// PullReport is the pull benchmark's result: figures by column and by key
// "<image>_<metric>" (and "pods10" for the ten pods of one cold image).
type PullReport struct {
	SizeMB int    `json:"size_mb"`
	Rounds int    `json:"rounds"`
	Cores  int    `json:"cores"`
	Seed   uint64 `json:"seed"`
	// Pods is how many pods the one-cold-image case starts (0: it did not run).
	Pods int `json:"pods,omitempty"`
	// Images are the images timed with their compressed size (MB) and file count.
	Images []PullImageInfo    `json:"images"`
	Values map[string]Results `json:"values"`
	Notes  []string           `json:"notes,omitempty"`
}

// PullImageInfo describes one generated image.
type PullImageInfo struct {
	Name   string  `json:"name"`
	MB     float64 `json:"mb"`
	TarMB  float64 `json:"tar_mb"`
	Layers int     `json:"layers"`
	Files  int     `json:"files"`
}

// Set stores a figure.
func (p *PullReport) Set(col, key string, v float64) {
	if p.Values == nil {
		p.Values = map[string]Results{}
	}
	if p.Values[col] == nil {
		p.Values[col] = Results{}
	}
	p.Values[col][key] = v
}

// bestContainerd is the lowest figure of the containerd columns for key, and its
// column; "" when none has one.
func (p *PullReport) bestContainerd(key string) (float64, string) {
	best, col := math.NaN(), ""
	for _, c := range PullColumns {
		v, ok := p.Values[c][key]
		if !strings.HasPrefix(c, pullContainerds) || !ok {
			continue
		}
		if col == "" || v < best {
			best, col = v, c
		}
	}
	return best, col
}

func verdict(ratio, target float64) string {
	if target == 0 || math.IsNaN(ratio) {
		return ""
	}
	if ratio <= target {
		return fmt.Sprintf("≤%.1f met", target)
	}
	return fmt.Sprintf("≤%.1f MISSED", target)
}

// WriteTable prints one row per image and metric that has figures: each column's
// figure, crisp's ratio to the best (lowest) containerd figure (the fastest
// containerd configuration for times) and to the parallel floor, with the targets.
func (p *PullReport) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "metric\tunit\t")
	for _, c := range PullColumns {
		fmt.Fprintf(tw, "%s\t", c)
	}
	fmt.Fprintln(tw, "crisp/best ctrd\ttarget\tcrisp/floor\ttarget\t")
	type row struct {
		m   PullMetric
		key string
	}
	var rows []row
	for _, img := range p.Images {
		for _, m := range PullMetrics {
			m.Name = img.Name + ": " + strings.TrimLeft(m.Name, " ")
			rows = append(rows, row{m, img.Name + "_" + m.Key})
		}
	}
	rows = append(rows, row{PullMetric{Key: "pods10", Name: fmt.Sprintf("%d pods, one cold image: all running", p.Pods), Unit: "ms", Target: 0.5}, "pods10"})
	for _, r := range rows {
		has := false
		for _, c := range PullColumns {
			_, ok := p.Values[c][r.key]
			has = has || ok
		}
		if !has {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t", r.m.Name, r.m.Unit)
		for _, c := range PullColumns {
			fmt.Fprintf(tw, "%s\t", num(p.Values[c], r.key, r.m.Unit))
		}
		crisp, ok := p.Values[PullCrisp][r.key]
		rb, rf := math.NaN(), math.NaN()
		if best, col := p.bestContainerd(r.key); ok && col != "" && best != 0 {
			rb = crisp / best
		}
		if floor, fok := p.Values[PullFloor][r.key]; ok && fok && floor != 0 {
			rf = crisp / floor
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", ratio(rb), verdict(rb, r.m.Target), ratio(rf), verdict(rf, r.m.FloorTarget))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, img := range p.Images {
		fmt.Fprintf(w, "image %s: %d layers, %.0f MB compressed, %.0f MB of tar, %d files\n", img.Name, img.Layers, img.MB, img.TarMB, img.Files)
	}
	fmt.Fprintf(w, "%d rounds, %d cores, seed %d; %s has max_concurrent_unpacks = %d\n", p.Rounds, p.Cores, p.Seed, PullCtrd2Par, p.Cores)
	for _, n := range p.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}

// Median is the middle of vs (the mean of the two middle ones for an even count).
func Median(vs []float64) float64 {
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
