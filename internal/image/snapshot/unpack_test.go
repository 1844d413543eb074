package snapshot

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

// TestConcurrentUnpack unpacks the layers of an image all at once, in a random order,
// and commits them bottom-up; every layer directory must be what containerd's
// archive.Apply makes of the layer with its lower layers at hand (the snapshotter's
// Apply did that until unpacks became concurrent), and what the snapshotter's own
// sequential Apply makes.
func TestConcurrentUnpack(t *testing.T) {
	requireOverlay(t)
	tests := []struct {
		name   string
		layers [][]entry
	}{
		{name: "three layers: whiteouts, opaque dirs, every entry type", layers: threeLayersEntries()},
		{
			name: "whiteout of a lower file",
			layers: [][]entry{
				{dirE("d/", 0o755), fileE("d/f", "f", 0o644), fileE("d/g", "g", 0o644)},
				{dirE("d/", 0o755), fileE("d/.wh.f", "", 0o644)},
				{fileE("d/.wh.g", "", 0o644)},
			},
		},
		{
			name: "opaque dir over a lower dir",
			layers: [][]entry{
				{owned(dirE("o/", 0o750), 5, 6), fileE("o/a", "a", 0o644), dirE("o/sub/", 0o755), fileE("o/sub/b", "b", 0o644)},
				{dirE("o/", 0o711), fileE("o/.wh..wh..opq", "", 0o644), fileE("o/new", "n", 0o644)},
				// The marker alone: o is created as its parent, with the lower's attributes.
				{fileE("o/.wh..wh..opq", "", 0o644), fileE("o/newer", "n", 0o600)},
			},
		},
		{
			name: "hard links within a layer",
			layers: [][]entry{
				{fileE("base", "b", 0o644)},
				{
					owned(fileE("f", "linked", 0o640), 3, 4), hardlinkE("g", "f"), dirE("sub/", 0o755), hardlinkE("sub/h", "f"),
					fileE("sub/i", "i", 0o644), hardlinkE("j", "sub/i"),
				},
			},
		},
		{
			name: "parent dirs only in a lower layer, with their attributes",
			layers: [][]entry{
				{
					xattr(owned(dirE("srv/", 0o2750), 1234, 5678), "user.k", "lower"),
					xattr(owned(dirE("srv/data/", 0o700), 7, 8), "user.deep", "d"),
					dirE("plain/", 0o755),
					owned(dirE("n/", 0o700), 9, 9),
				},
				{fileE("other", "o", 0o644), fileE("n", "a file over the lower dir", 0o644)},
				{
					fileE("srv/data/x", "x", 0o644),
					fileE("new/deep/y", "y", 0o644),
					// n's topmost lower is a file: default attributes.
					fileE("n/z", "z", 0o644),
					// A dir entry after the dir was made as a parent: the entry's
					// attributes, the lower's extended attributes kept.
					fileE("plain/p", "p", 0o644),
					xattr(owned(dirE("srv/", 0o755), 1, 2), "user.e", "entry"),
					xattr(dirE("plain/", 0o700), "user.k", "entry"),
				},
			},
		},
		{
			name: "implicit dir removed and made again",
			layers: [][]entry{
				{xattr(owned(dirE("a/", 0o700), 4, 4), "user.lower", "a"), owned(dirE("a/b/", 0o711), 5, 5)},
				{
					fileE("a/b/f", "f", 0o644), fileE("a", "now a file", 0o644),
					dirE("a/", 0o750), fileE("a/b/g", "g", 0o644),
				},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var datas [][]byte
			for _, es := range tc.layers {
				datas = append(datas, layerTar(t, es...))
			}
			start := time.Now()
			want := referenceUnpack(t, datas)

			seq := newFixture(t, "")
			seqChain := applyAll(t, seq.s, datas...)

			conc := newFixture(t, "")
			chain := unpackConcurrently(t, conc.s, datas)
			if !slices.Equal(chain, seqChain) {
				t.Fatalf("chain %v, sequential %v", chain, seqChain)
			}
			var dirs []string // the concurrent unpack's, bottom-up
			for i, c := range chain {
				info, err := conc.s.Stat(c)
				if err != nil {
					t.Fatal(err)
				}
				dirs = append(dirs, info.Dir)
				seqInfo, err := seq.s.Stat(c)
				if err != nil {
					t.Fatal(err)
				}
				if info.Size != seqInfo.Size || info.Inodes != seqInfo.Inodes || info.Parent != seqInfo.Parent {
					t.Errorf("layer %d: %+v, sequential %+v", i, info, seqInfo)
				}
				got := fullTree(t, info.Dir, start)
				if d := diffTrees(fullTree(t, seqInfo.Dir, start), got); d != "" {
					t.Errorf("layer %d differs from the sequential Apply's:\n%s", i, d)
				}
				ref := fullTree(t, want[i], start)
				for _, dir := range parentOnlyDirs(t, info.Dir, tc.layers[i]) {
					// containerd gives a directory made as a parent the times of the
					// topmost lower layer's directory there, and then creates the entry
					// in it, which makes its modification time now; the snapshotter
					// keeps the lower's.
					if lower := topmost(dirs[:i], dir); lower != "" {
						if g, w := mtimeOf(t, filepath.Join(info.Dir, dir)), mtimeOf(t, lower); g != w {
							t.Errorf("layer %d: dir %s made as a parent has %s, want the lower's %s", i, dir, g, w)
						}
					}
					ref[dir] = withoutTime(ref[dir])
					got[dir] = withoutTime(got[dir])
				}
				if d := diffTrees(ref, got); d != "" {
					t.Errorf("layer %d differs from containerd's unpack:\n%s", i, d)
				}
			}
			if left := names(t, conc.root); len(left) != len(chain) {
				t.Errorf("root holds %v, want only the %d layers", left, len(chain))
			}
		})
	}
}

// parentOnlyDirs lists the directories of layer dir that have no entry in es: archive.Apply
// made them as parents of entries.
func parentOnlyDirs(t *testing.T, dir string, es []entry) []string {
	t.Helper()
	entries := map[string]bool{}
	for _, e := range es {
		if e.hdr.Typeflag == tar.TypeDir {
			entries[filepath.Clean(e.hdr.Name)] = true
		}
	}
	var out []string
	for p, d := range tree(t, dir) {
		if strings.HasPrefix(d, "dir ") && !entries[p] {
			out = append(out, p)
		}
	}
	return out
}

// topmost returns rel in the topmost of the layer dirs (bottom-up) that has something
// there, if that is a directory, the way containerd's mkparent looks for it; "" when
// there is none.
func topmost(dirs []string, rel string) string {
	for i := len(dirs) - 1; i >= 0; i-- {
		p := filepath.Join(dirs[i], rel)
		if fi, err := os.Lstat(p); err == nil {
			if fi.IsDir() {
				return p
			}
			return ""
		}
	}
	return ""
}

// unpackConcurrently claims every layer's chain ID, unpacks all layers at once (in a
// random order of start), and commits each as soon as it is unpacked and its parent
// committed. It returns the chain IDs.
func unpackConcurrently(t *testing.T, s *Snapshotter, datas [][]byte) []digest.Digest {
	t.Helper()
	ctx := context.Background()
	chain := make([]digest.Digest, len(datas))
	var parent digest.Digest
	for i, data := range datas {
		chain[i] = chainID(parent, data)
		parent = chain[i]
	}
	committed := make([]chan struct{}, len(datas))
	for i := range committed {
		committed[i] = make(chan struct{})
	}
	errs := make([]error, len(datas))
	var wg sync.WaitGroup
	for _, i := range rand.Perm(len(datas)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(committed[i])
			c, _, err := s.Claim(ctx, chain[i])
			if err != nil || c == nil {
				errs[i] = fmt.Errorf("claim: %v, %v", c, err)
				return
			}
			defer c.Release()
			p, err := s.Unpack(ctx, fmt.Sprintf("layer%d", i), bytes.NewReader(datas[i]))
			if err != nil {
				errs[i] = err
				return
			}
			var parent digest.Digest
			if i > 0 {
				<-committed[i-1]
				parent = chain[i-1]
			}
			_, errs[i] = s.Commit(ctx, c, p, parent)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
	}
	return chain
}

// referenceUnpack unpacks the layers with containerd's archive.Apply, each with its
// lower layers, as containerd's overlay snapshotter does; it returns the directories.
func referenceUnpack(t *testing.T, datas [][]byte) []string {
	t.Helper()
	base := t.TempDir()
	var dirs, lowers []string
	for i, data := range datas {
		dir := filepath.Join(base, fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := archive.Apply(context.Background(), dir, bytes.NewReader(data),
			archive.WithConvertWhiteout(archive.OverlayConvertWhiteout), archive.WithParents(lowers))
		if err != nil {
			t.Fatalf("containerd's unpack of layer %d: %v", i, err)
		}
		dirs = append(dirs, dir)
		lowers = append([]string{dir}, lowers...)
	}
	return dirs
}

// fullTree is tree with each entry's modification time (but a symlink's; "now" for
// times after start, which differ between runs) and, for files linked more than once,
// the other names of the inode.
func fullTree(t testing.TB, dir string, start time.Time) map[string]string {
	t.Helper()
	out := tree(t, dir)
	byInode := map[uint64][]string{}
	for p, d := range out {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			m := mtimeOf(t, filepath.Join(dir, p))
			if !time.Unix(st.Mtim.Unix()).Before(start) {
				m = "mtime now"
			}
			out[p] = d + " " + m
		}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			byInode[st.Ino] = append(byInode[st.Ino], p)
		}
	}
	for _, ps := range byInode {
		sort.Strings(ps)
		for _, p := range ps {
			out[p] += " links=" + strings.Join(ps, ",")
		}
	}
	return out
}

func mtimeOf(t testing.TB, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return "mtime " + time.Unix(st.Mtim.Unix()).UTC().Format(time.RFC3339Nano)
}

// withoutTime drops what fullTree adds for the time.
func withoutTime(d string) string {
	i := strings.Index(d, " mtime ")
	if i < 0 {
		return d
	}
	rest := d[i+len(" mtime "):]
	if j := strings.Index(rest, " "); j >= 0 {
		return d[:i] + rest[j:]
	}
	return d[:i]
}

// threeLayersEntries is threeLayers' content, as entries.
func threeLayersEntries() [][]entry {
	return [][]entry{
		{
			dirE("bin/", 0o755),
			xattr(owned(fileE("bin/tool", "#!tool", 0o750), 1000, 1001), "user.origin", "l0"),
			owned(withMode(hardlinkE("bin/tool2", "bin/tool"), 0o750), 1000, 1001),
			fileE("bin/su", "su", 0o4755),
			dirE("etc/", 0o755),
			fileE("etc/hosts", "l0 hosts", 0o644),
			dirE("del/", 0o755),
			fileE("del/gone", "bye", 0o644),
			fileE("del/stays", "stay", 0o600),
			owned(dirE("opq/", 0o750), 5, 6),
			fileE("opq/old", "old", 0o644),
			dirE("opq/sub/", 0o755),
			fileE("opq/sub/old2", "old2", 0o644),
			symlinkE("link", "etc/hosts"),
			symlinkE("abs", "/etc/passwd"),
			dirE("dev/", 0o755),
			charE("dev/null", 1, 3, 0o666),
		},
		{
			fileE("del/.wh.gone", "", 0o644),
			dirE("opq/", 0o711),
			fileE("opq/.wh..wh..opq", "", 0o644),
			fileE("opq/new", "new", 0o644),
			fileE("etc/hosts", "l1 hosts", 0o644),
			owned(dirE("home/u/", 0o700), 1000, 1000),
			fifoE("run.fifo", 0o600),
			dirE("usr/lib/", 0o755),
			symlinkE("lib", "usr/lib"),
		},
		{
			fileE(".wh.run.fifo", "", 0o644),
			fileE("usr/lib/libx.so", "elf", 0o644),
			owned(fileE("./home/u/.profile", "export X=1", 0o644), 1000, 1000),
			fileE("etc/l2", "two", 0o400),
		},
	}
}

// TestCommitRefusesLowerSymlink: an entry reached through a symlink of a lower layer is
// only seen to be one at Commit; it fails there as Apply fails, and leaves nothing.
func TestCommitRefusesLowerSymlink(t *testing.T) {
	sentinel := t.TempDir()
	tests := []struct {
		name  string
		base  [][]entry
		layer []entry
		want  string // the error after "unpack layer evil: "
	}{
		{
			name:  "through a lower symlink",
			base:  [][]entry{{symlinkE("evil", sentinel)}},
			layer: []entry{fileE("ok", "ok", 0o644), fileE("evil/file", "x", 0o644)},
			want:  `refused entry "evil/file": parent "evil" is a symlink in a lower layer: invalid argument`,
		},
		{
			name:  "deeper, the first of two in tar order",
			base:  [][]entry{{dirE("d/", 0o755), symlinkE("d/s", sentinel), symlinkE("t", sentinel)}, {fileE("d/other", "o", 0o644)}},
			layer: []entry{fileE("d/s/x/y", "x", 0o644), fileE("t/z", "z", 0o644)},
			want:  `refused entry "d/s/x/y": parent "d/s" is a symlink in a lower layer: invalid argument`,
		},
		{
			name: "an opaque dir of the layer made a file and a dir again hides nothing",
			base: [][]entry{{dirE("d/", 0o755), symlinkE("d/s", sentinel)}},
			layer: []entry{
				dirE("d/", 0o755), fileE("d/.wh..wh..opq", "", 0o644),
				fileE("d", "file", 0o644), dirE("d/", 0o755), fileE("d/s/f", "f", 0o644),
			},
			want: `refused entry "d/s/f": parent "d/s" is a symlink in a lower layer: invalid argument`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var base [][]byte
			for _, es := range tc.base {
				base = append(base, layerTar(t, es...))
			}
			data := layerTar(t, tc.layer...)

			seq := newFixture(t, "")
			seqChain := applyAll(t, seq.s, base...)
			parent := seqChain[len(seqChain)-1]
			_, applyErr := seq.s.Apply(context.Background(), chainID(parent, data), parent, "evil", bytes.NewReader(data))
			if applyErr == nil || applyErr.Error() != "unpack layer evil: "+tc.want {
				t.Errorf("Apply = %v, want %q", applyErr, tc.want)
			}

			f := newFixture(t, "")
			chain := applyAll(t, f.s, base...)
			c, _, err := f.s.Claim(context.Background(), chainID(parent, data))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Release()
			p, err := f.s.Unpack(context.Background(), "evil", bytes.NewReader(data))
			if err != nil {
				t.Fatalf("Unpack: %v (the lower layers are not known yet)", err)
			}
			_, err = f.s.Commit(context.Background(), c, p, chain[len(chain)-1])
			if !errdefs.IsInvalidArgument(err) || applyErr == nil || err.Error() != applyErr.Error() {
				t.Errorf("Commit = %v, want InvalidArgument %q as Apply's", err, applyErr)
			}
			if got := names(t, f.root); len(got) != len(base) {
				t.Errorf("root holds %v, want only the base layers", got)
			}
			if got := names(t, sentinel); len(got) != 0 {
				t.Errorf("written outside the layer: %v", got)
			}
			if err := p.Discard(); err != nil {
				t.Errorf("Discard after a failed Commit: %v", err)
			}
		})
	}
}

// TestClaim: one claim per chain ID at a time; waiters see the snapshot once committed,
// or try themselves when the claim is released without one.
func TestClaim(t *testing.T) {
	f := newFixture(t, "")
	ctx := context.Background()
	data := layerTar(t, fileE("f", "f", 0o644))
	c := chainID("", data)

	if _, _, err := f.s.Claim(ctx, "sha256:nope"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Claim of a bad chain ID: %v, want InvalidArgument", err)
	}

	// claimAsync claims c in a goroutine; the result arrives on the channel.
	type result struct {
		claim *Claim
		info  Info
		err   error
	}
	claimAsync := func(ctx context.Context) chan result {
		ch := make(chan result, 1)
		go func() {
			cl, info, err := f.s.Claim(ctx, c)
			ch <- result{cl, info, err}
		}()
		return ch
	}
	waiting := func(ch chan result) {
		t.Helper()
		select {
		case r := <-ch:
			t.Fatalf("second Claim returned while the first is held: %+v", r)
		case <-time.After(200 * time.Millisecond):
		}
	}

	first, _, err := f.s.Claim(ctx, c)
	if err != nil || first == nil {
		t.Fatalf("Claim = %v, %v", first, err)
	}
	// Released without a commit: the next claimer gets the claim.
	second := claimAsync(ctx)
	waiting(second)
	first.Release()
	first.Release()
	r := <-second
	if r.err != nil || r.claim == nil {
		t.Fatalf("Claim after a Release without Commit = %+v, want a claim", r)
	}
	if _, err := f.s.Commit(ctx, first, mustUnpack(t, f.s, data), ""); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Commit with a released claim: %v, want FailedPrecondition", err)
	}

	// A waiter that gives up.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if r := <-claimAsync(short); !errors.Is(r.err, context.DeadlineExceeded) || r.claim != nil {
		t.Errorf("Claim with a context ending while another is held = %+v, want DeadlineExceeded", r)
	}

	// Committed: the waiter sees the snapshot.
	third := claimAsync(ctx)
	waiting(third)
	info, err := f.s.Commit(ctx, r.claim, mustUnpack(t, f.s, data), "")
	if err != nil {
		t.Fatal(err)
	}
	r.claim.Release()
	if r := <-third; r.err != nil || r.claim != nil || r.info != info {
		t.Errorf("Claim after a Commit = %+v, want no claim and %+v", r, info)
	}
	if cl, got, err := f.s.Claim(ctx, c); err != nil || cl != nil || got != info {
		t.Errorf("Claim of an existing snapshot = %v, %+v, %v; want nil, %+v", cl, got, err, info)
	}
	if got := names(t, f.root); len(got) != 1 {
		t.Errorf("root holds %v, want the one layer", got)
	}
}

func mustUnpack(t *testing.T, s *Snapshotter, data []byte) *Pending {
	t.Helper()
	p, err := s.Unpack(context.Background(), "l", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCommitParent: Commit needs the parent committed (FailedPrecondition otherwise:
// the caller commits bottom-up), and pins it from then on.
func TestCommitParent(t *testing.T) {
	f := newFixture(t, "")
	ctx := context.Background()
	l0 := layerTar(t, fileE("a", "a", 0o644))
	l1 := layerTar(t, fileE("b", "b", 0o644))
	c0 := chainID("", l0)
	c1 := chainID(c0, l1)

	claim1, _, err := f.s.Claim(ctx, c1)
	if err != nil {
		t.Fatal(err)
	}
	defer claim1.Release()
	p1 := mustUnpack(t, f.s, l1)
	_, err = f.s.Commit(ctx, claim1, p1, c0)
	if !errdefs.IsFailedPrecondition(err) || errdefs.IsNotFound(err) || !strings.Contains(err.Error(), c0.String()) {
		t.Errorf("Commit on a missing parent: %v, want FailedPrecondition naming it", err)
	}
	if got := names(t, f.root); len(got) != 0 {
		t.Errorf("root holds %v after a failed Commit, want nothing", got)
	}
	if _, err := f.s.Commit(ctx, claim1, p1, c0); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Commit of a consumed Pending: %v, want FailedPrecondition", err)
	}

	// The parent removed between the claim and the commit.
	applyAll(t, f.s, l0)
	p1 = mustUnpack(t, f.s, l1)
	if err := f.s.Remove(c0); err != nil {
		t.Fatalf("Remove of a parent no commit uses yet: %v", err)
	}
	if _, err := f.s.Commit(ctx, claim1, p1, c0); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Commit on a removed parent: %v, want FailedPrecondition", err)
	}

	applyAll(t, f.s, l0)
	info, err := f.s.Commit(ctx, claim1, mustUnpack(t, f.s, l1), c0)
	if err != nil {
		t.Fatal(err)
	}
	if info.ChainID != c1 || info.Parent != c0 {
		t.Errorf("Commit = %+v, want %s on %s", info, c1, c0)
	}
	if err := f.s.Remove(c0); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Remove of a committed layer's parent: %v, want FailedPrecondition", err)
	}
}

// TestApplyPinsParent: while Apply unpacks, its parent cannot be removed.
func TestApplyPinsParent(t *testing.T) {
	f := newFixture(t, "")
	base := applyAll(t, f.s, layerTar(t, fileE("a", "a", 0o644)))[0]
	data := layerTar(t, fileE("b", "b", 0o644))
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := f.s.Apply(context.Background(), chainID(base, data), base, "l1", pr)
		done <- err
	}()
	// The first bytes are read: the claim is in place.
	if _, err := pw.Write(data[:512]); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Remove(base); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "being unpacked") {
		t.Errorf("Remove of the parent of an Apply in progress: %v, want FailedPrecondition", err)
	}
	if _, err := pw.Write(data[512:]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPendingCleanup: nothing of an unpack remains after Discard, a failed Unpack, or a
// context ended in the middle of one.
func TestPendingCleanup(t *testing.T) {
	f := newFixture(t, "")
	var entries []entry
	for i := range 50 {
		entries = append(entries, fileE(fmt.Sprintf("d%d/f", i), strings.Repeat("x", 4096), 0o644))
	}
	data := layerTar(t, entries...)

	p := mustUnpack(t, f.s, data)
	if got := names(t, f.root); len(got) != 1 || !strings.HasPrefix(got[0], tmpPrefix) {
		t.Errorf("root holds %v while unpacked, want one %s dir", got, tmpPrefix)
	}
	for range 2 {
		if err := p.Discard(); err != nil {
			t.Errorf("Discard: %v", err)
		}
		if got := names(t, f.root); len(got) != 0 {
			t.Errorf("root holds %v after Discard", got)
		}
	}
	claim, _, err := f.s.Claim(context.Background(), chainID("", data))
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Release()
	if _, err := f.s.Commit(context.Background(), claim, p, ""); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Commit after Discard: %v, want FailedPrecondition", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := io.MultiReader(&errReader{r: bytes.NewReader(data[:len(data)/2]), err: io.EOF, before: cancel}, bytes.NewReader(data[len(data)/2:]))
	if _, err := f.s.Unpack(ctx, "cut", r); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "cut") {
		t.Errorf("Unpack with the context canceled midway: %v, want Canceled naming the layer", err)
	}
	if got := names(t, f.root); len(got) != 0 {
		t.Errorf("root holds %v after a canceled Unpack", got)
	}
	if _, err := f.s.Unpack(context.Background(), "evil", bytes.NewReader(layerTar(t, fileE("../x", "x", 0o644)))); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Unpack of a bad layer: %v, want InvalidArgument", err)
	}
	if got := names(t, f.root); len(got) != 0 {
		t.Errorf("root holds %v after a refused Unpack", got)
	}

	// Committed: Discard is a no-op.
	p = mustUnpack(t, f.s, data)
	info, err := f.s.Commit(context.Background(), claim, p, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Discard(); err != nil {
		t.Errorf("Discard after Commit: %v", err)
	}
	if _, err := os.Stat(filepath.Join(info.Dir, "d0/f")); err != nil {
		t.Errorf("Discard after Commit removed the layer: %v", err)
	}
}

// TestUnpackEntryCheck: WithEntryCheck sees every entry Unpack writes with the bytes of
// its data (0 for a directory), before writing it, and its error fails the unpack as
// it is and leaves nothing.
func TestUnpackEntryCheck(t *testing.T) {
	f := newFixture(t, "")
	data := layerTar(t, dirE("d", 0o755), fileE("d/a", "hello", 0o644), fileE("d/b", "bye", 0o644))
	var seen []string
	p, err := f.s.Unpack(context.Background(), "l", bytes.NewReader(data), WithEntryCheck(func(name string, size int64) error {
		seen = append(seen, fmt.Sprintf("%s:%d", name, size))
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Discard(); err != nil {
		t.Fatal(err)
	}
	if want := "d:0 d/a:5 d/b:3"; strings.Join(seen, " ") != want {
		t.Errorf("entries checked %q, want %q", strings.Join(seen, " "), want)
	}
	stop := errors.New("too much")
	_, err = f.s.Unpack(context.Background(), "l", bytes.NewReader(data), WithEntryCheck(func(name string, _ int64) error {
		if name == "d/b" {
			return stop
		}
		return nil
	}))
	if !errors.Is(err, stop) || !strings.Contains(err.Error(), "unpack layer l") {
		t.Errorf("Unpack with a failing check: %v, want its error naming the layer", err)
	}
	if got := names(t, f.root); len(got) != 0 {
		t.Errorf("root holds %v after a refused Unpack", got)
	}
}
