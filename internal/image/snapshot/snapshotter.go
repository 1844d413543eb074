package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/image/diskspace"
	"github.com/crisp-runtime/crisp/internal/store"
)

// Buckets of the metadata store; named so that they cannot clash with other packages'.
const (
	layerBucket  = "snapshots"
	activeBucket = "snapshot-active"
)

// tmpPrefix marks directories under root that are not (yet, or any more) a snapshot:
// unpacks in progress and removals in progress. Open deletes them all.
const tmpPrefix = "tmp-"

// Snapshotter stores image layers as overlay lower directories and container rootfs
// snapshots as overlay upper directories. It is safe for concurrent use.
//
// Directories are root/<n> for a layer (the directory is the layer's filesystem) and
// root/<n>/fs + root/<n>/work for an active snapshot, n being a small number recorded in
// the store: overlay's mount options must fit in one page, so every byte of a lowerdir
// path limits how many layers an image may have.
type Snapshotter struct {
	root     string
	st       *store.Store
	indexOff bool

	// mu serialises metadata changes (so that a parent cannot be removed while a child
	// or an active snapshot is being created on it) and guards nextID and applying, the
	// outstanding claims by chain ID.
	mu       sync.Mutex
	nextID   uint64
	applying map[digest.Digest]*flight
}

// layerRecord is what the store holds for one committed layer.
type layerRecord struct {
	ID      uint64        `json:"id"`
	Parent  digest.Digest `json:"parent,omitempty"`
	Size    int64         `json:"size"`
	Inodes  int64         `json:"inodes"`
	Created time.Time     `json:"created"`
}

// activeRecord is what the store holds for one writable snapshot.
type activeRecord struct {
	ID      uint64        `json:"id"`
	Parent  digest.Digest `json:"parent,omitempty"`
	Created time.Time     `json:"created"`
}

// Info describes one committed layer snapshot.
type Info struct {
	ChainID digest.Digest
	Parent  digest.Digest
	// Dir is the layer's filesystem directory (an overlay lowerdir).
	Dir     string
	Size    int64
	Inodes  int64
	Created time.Time
}

// Mount is one mount making up a rootfs, in mount(8) terms.
type Mount struct {
	Type    string
	Source  string
	Options []string
}

// Open uses root for directories and st for metadata, and removes what interrupted
// operations left behind so that a crash never leaves stray files.
func Open(root string, st *store.Store) (*Snapshotter, error) {
	if root == "" || st == nil {
		return nil, fmt.Errorf("open snapshotter: root and store are required: %w", errdefs.ErrInvalidArgument)
	}
	// Mount options are interpreted by whoever mounts, possibly in another directory.
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("open snapshotter: %w", err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("open snapshotter: create %s: %w", root, err)
	}
	s := &Snapshotter{
		root:     root,
		st:       st,
		indexOff: supportsIndex(),
		applying: map[digest.Digest]*flight{},
	}
	if err := s.recover(); err != nil {
		return nil, fmt.Errorf("open snapshotter %s: %w", root, err)
	}
	return s, nil
}

// recover makes directories and metadata agree: records whose directory is gone are
// dropped (with the layers built on them, which cannot be mounted any more), and
// directories no record names are deleted. Such directories are left by a crash in the
// middle of an unpack, a Prepare or a removal; the store is the truth.
func (s *Snapshotter) recover() error {
	layers := map[digest.Digest]layerRecord{}
	err := s.st.ForEach(layerBucket, func(key string, data []byte) error {
		var rec layerRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("decode snapshot %s: %w", key, err)
		}
		layers[digest.Digest(key)] = rec
		return nil
	})
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	for changed := true; changed; {
		changed = false
		for id, rec := range layers {
			_, parentOK := layers[rec.Parent]
			if rec.Parent != "" && !parentOK || !exists(s.dir(rec.ID)) {
				if err := s.st.Delete(layerBucket, id.String()); err != nil {
					return err
				}
				delete(layers, id)
				changed = true
			}
		}
	}
	inUse := map[uint64]bool{}
	var maxID uint64
	for _, rec := range layers {
		inUse[rec.ID] = true
		maxID = max(maxID, rec.ID)
	}
	err = s.st.ForEach(activeBucket, func(key string, data []byte) error {
		var rec activeRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("decode active snapshot %s: %w", key, err)
		}
		inUse[rec.ID] = true
		maxID = max(maxID, rec.ID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("list active snapshots: %w", err)
	}
	entries, err := os.ReadDir(s.root)
	if err != nil {
		return fmt.Errorf("read %s: %w", s.root, err)
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		id, numErr := strconv.ParseUint(name, 10, 64)
		if numErr == nil {
			// Never reuse a number, even one about to be deleted.
			maxID = max(maxID, id)
		}
		if strings.HasPrefix(name, tmpPrefix) || numErr == nil && !inUse[id] {
			if err := os.RemoveAll(filepath.Join(s.root, name)); err != nil {
				errs = append(errs, fmt.Errorf("remove leftover %s: %w", name, err))
			}
		}
	}
	s.nextID = maxID + 1
	return errors.Join(errs...)
}

// dir is the directory of snapshot number id.
func (s *Snapshotter) dir(id uint64) string {
	return filepath.Join(s.root, strconv.FormatUint(id, 10))
}

// Stat returns the layer snapshot chainID; errdefs.ErrNotFound when there is none.
func (s *Snapshotter) Stat(chainID digest.Digest) (Info, error) {
	var rec layerRecord
	if err := s.get(layerBucket, chainID.String(), &rec); err != nil {
		return Info{}, fmt.Errorf("snapshot %s: %w", chainID, err)
	}
	return s.info(chainID, rec), nil
}

func (s *Snapshotter) info(chainID digest.Digest, rec layerRecord) Info {
	return Info{
		ChainID: chainID,
		Parent:  rec.Parent,
		Dir:     s.dir(rec.ID),
		Size:    rec.Size,
		Inodes:  rec.Inodes,
		Created: rec.Created,
	}
}

// List returns every layer snapshot, in chain ID order.
func (s *Snapshotter) List() ([]Info, error) {
	var out []Info
	err := s.st.ForEach(layerBucket, func(key string, data []byte) error {
		var rec layerRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("decode snapshot %s: %w", key, err)
		}
		out = append(out, s.info(digest.Digest(key), rec))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return out, nil
}

// ActiveKeys returns the keys of every writable snapshot.
func (s *Snapshotter) ActiveKeys() ([]string, error) {
	var keys []string
	err := s.st.ForEach(activeBucket, func(key string, _ []byte) error {
		keys = append(keys, key)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list active snapshots: %w", err)
	}
	return keys, nil
}

// errStop ends a store scan early.
var errStop = errors.New("stop")

// userOfLocked names what builds on layer chainID (a child layer, an active snapshot or
// an unpack in progress), or returns "" when nothing does; s.mu must be held.
func (s *Snapshotter) userOfLocked(chainID digest.Digest) (string, error) {
	for child, fl := range s.applying {
		if fl.parent == chainID {
			return "the layer being unpacked as " + child.String(), nil
		}
	}
	var user string
	scan := func(bucket, what string) error {
		err := s.st.ForEach(bucket, func(key string, data []byte) error {
			// Both record kinds keep the parent under the same JSON name.
			var rec struct {
				Parent digest.Digest `json:"parent"`
			}
			if err := json.Unmarshal(data, &rec); err != nil {
				return fmt.Errorf("decode %s/%s: %w", bucket, key, err)
			}
			if rec.Parent == chainID {
				user = what + " " + key
				return errStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			return err
		}
		return nil
	}
	if err := scan(layerBucket, "snapshot"); err != nil || user != "" {
		return user, err
	}
	err := scan(activeBucket, "active snapshot")
	return user, err
}

// Remove deletes layer snapshot chainID. It refuses with errdefs.ErrFailedPrecondition
// while a child layer or an active snapshot uses it; unknown chain IDs are not an error.
func (s *Snapshotter) Remove(chainID digest.Digest) error {
	s.mu.Lock()
	var rec layerRecord
	if err := s.get(layerBucket, chainID.String(), &rec); err != nil {
		s.mu.Unlock()
		if errdefs.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("remove snapshot %s: %w", chainID, err)
	}
	user, err := s.userOfLocked(chainID)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("remove snapshot %s: %w", chainID, err)
	}
	if user != "" {
		s.mu.Unlock()
		return fmt.Errorf("remove snapshot %s: used by %s: %w", chainID, user, errdefs.ErrFailedPrecondition)
	}
	trash, err := s.unlinkLocked(layerBucket, chainID.String(), s.dir(rec.ID))
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("remove snapshot %s: %w", chainID, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		// The record is gone; Open finishes the job.
		return fmt.Errorf("remove snapshot %s: delete %s: %w", chainID, trash, err)
	}
	return nil
}

// unlinkLocked moves dir to a temporary name and then deletes the record, so that a
// snapshot is either whole and recorded or about to be deleted, and returns the new
// name for the caller to delete outside the lock. s.mu must be held.
func (s *Snapshotter) unlinkLocked(bucket, key, dir string) (string, error) {
	trash := filepath.Join(s.root, tmpPrefix+"rm-"+filepath.Base(dir))
	if err := os.Rename(dir, trash); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("move %s aside: %w", dir, err)
	}
	if err := s.st.Delete(bucket, key); err != nil {
		if rerr := os.Rename(trash, dir); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("move %s back: %w", dir, rerr))
		}
		return "", err
	}
	return trash, nil
}

// chainLocked returns the directories of chainID and all its ancestors, topmost first:
// the overlay lowerdir order. s.mu must be held (or the chain otherwise pinned).
func (s *Snapshotter) chainLocked(chainID digest.Digest) ([]string, error) {
	var dirs []string
	for c := chainID; c != ""; {
		var rec layerRecord
		if err := s.get(layerBucket, c.String(), &rec); err != nil {
			if c != chainID {
				return nil, fmt.Errorf("ancestor %s of snapshot %s: %w", c, chainID, err)
			}
			return nil, fmt.Errorf("snapshot %s: %w", chainID, err)
		}
		dirs = append(dirs, s.dir(rec.ID))
		c = rec.Parent
		if len(dirs) > maxDepth {
			return nil, fmt.Errorf("snapshot %s: chain longer than %d layers (a loop?): %w", chainID, maxDepth, errdefs.ErrFailedPrecondition)
		}
	}
	return dirs, nil
}

// maxDepth bounds a parent chain: overlayfs stacks at most 500 layers (OVL_MAX_STACK).
const maxDepth = 500

// Prepare creates the writable snapshot key on top of layer parent (empty for an empty
// rootfs) and returns how to mount it; errdefs.ErrAlreadyExists when key exists.
func (s *Snapshotter) Prepare(key string, parent digest.Digest) (_ []Mount, retErr error) {
	if key == "" {
		return nil, fmt.Errorf("prepare snapshot: empty key: %w", errdefs.ErrInvalidArgument)
	}
	// A full filesystem is ResourceExhausted; the directories are removed below.
	defer func() { retErr = diskspace.Classify(retErr, s.root) }()
	s.mu.Lock()
	defer s.mu.Unlock()
	var existing activeRecord
	err := s.get(activeBucket, key, &existing)
	if err == nil {
		return nil, fmt.Errorf("prepare snapshot %s: %w", key, errdefs.ErrAlreadyExists)
	}
	if !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("prepare snapshot %s: %w", key, err)
	}
	var lowers []string
	if parent != "" {
		if lowers, err = s.chainLocked(parent); err != nil {
			return nil, fmt.Errorf("prepare snapshot %s: parent: %w", key, err)
		}
	}
	id := s.nextID
	mounts, err := s.mounts(s.dir(id), lowers)
	if err != nil {
		return nil, fmt.Errorf("prepare snapshot %s: %w", key, err)
	}

	tmp, err := os.MkdirTemp(s.root, tmpPrefix)
	if err != nil {
		return nil, fmt.Errorf("prepare snapshot %s: %w", key, err)
	}
	defer func() {
		if retErr != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("prepare snapshot %s: %w", key, err)
	}
	upper := filepath.Join(tmp, "fs")
	if err := os.Mkdir(upper, 0o755); err != nil {
		return nil, fmt.Errorf("prepare snapshot %s: %w", key, err)
	}
	// The rootfs's root directory is the upper dir; give it the image's owner as
	// containerd does, or a non-root image could not write to its own /.
	if len(lowers) > 0 {
		var st unix.Stat_t
		if err := unix.Lstat(lowers[0], &st); err != nil {
			return nil, fmt.Errorf("prepare snapshot %s: stat parent: %w", key, err)
		}
		if err := os.Lchown(upper, int(st.Uid), int(st.Gid)); err != nil {
			return nil, fmt.Errorf("prepare snapshot %s: %w", key, err)
		}
		if err := os.Mkdir(filepath.Join(tmp, "work"), 0o711); err != nil {
			return nil, fmt.Errorf("prepare snapshot %s: %w", key, err)
		}
	}
	if err := os.Rename(tmp, s.dir(id)); err != nil {
		return nil, fmt.Errorf("prepare snapshot %s: %w", key, err)
	}
	tmp = s.dir(id) // what to delete on failure from here on
	s.nextID++
	rec := activeRecord{ID: id, Parent: parent, Created: time.Now().UTC()}
	if err := s.st.Put(activeBucket, key, rec); err != nil {
		return nil, fmt.Errorf("prepare snapshot %s: %w", key, err)
	}
	return mounts, nil
}

// Mounts returns how to mount the writable snapshot key; errdefs.ErrNotFound when absent.
func (s *Snapshotter) Mounts(key string) ([]Mount, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rec activeRecord
	if err := s.get(activeBucket, key, &rec); err != nil {
		return nil, fmt.Errorf("mounts of snapshot %s: %w", key, err)
	}
	var lowers []string
	if rec.Parent != "" {
		var err error
		if lowers, err = s.chainLocked(rec.Parent); err != nil {
			return nil, fmt.Errorf("mounts of snapshot %s: parent: %w", key, err)
		}
	}
	m, err := s.mounts(s.dir(rec.ID), lowers)
	if err != nil {
		return nil, fmt.Errorf("mounts of snapshot %s: %w", key, err)
	}
	return m, nil
}

// mounts builds the mounts of the active snapshot in dir over lowers (topmost first),
// as containerd's overlay snapshotter does: a bind mount when there is no lower layer
// (overlay needs one), overlay otherwise.
func (s *Snapshotter) mounts(dir string, lowers []string) ([]Mount, error) {
	if len(lowers) == 0 {
		return []Mount{{Type: "bind", Source: filepath.Join(dir, "fs"), Options: []string{"rw", "rbind"}}}, nil
	}
	opts := []string{
		"workdir=" + filepath.Join(dir, "work"),
		"upperdir=" + filepath.Join(dir, "fs"),
		"lowerdir=" + strings.Join(lowers, ":"),
	}
	if s.indexOff {
		// Layers are shared by many mounts; the inode index would tie a lower layer to
		// the first upper dir it was mounted with and fail later mounts.
		opts = append(opts, "index=off")
	}
	// mount(2) copies at most one page of options, NUL included; fail here with a
	// message instead of an EINVAL from the mount.
	if n := len(strings.Join(opts, ",")); n >= os.Getpagesize() {
		return nil, fmt.Errorf("%d layers need %d bytes of overlay mount options, more than the %d a mount takes: %w",
			len(lowers), n, os.Getpagesize()-1, errdefs.ErrInvalidArgument)
	}
	return []Mount{{Type: "overlay", Source: "overlay", Options: opts}}, nil
}

// RemoveActive deletes the writable snapshot key and everything written to it; unknown
// keys are not an error. It refuses (errdefs.ErrFailedPrecondition) while its overlay is
// still mounted in this mount namespace: deleting the upper dir under a running
// container would destroy its files.
func (s *Snapshotter) RemoveActive(key string) error {
	s.mu.Lock()
	var rec activeRecord
	if err := s.get(activeBucket, key, &rec); err != nil {
		s.mu.Unlock()
		if errdefs.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("remove snapshot %s: %w", key, err)
	}
	dir := s.dir(rec.ID)
	if mp, err := overlayMountOf(filepath.Join(dir, "fs")); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("remove snapshot %s: %w", key, err)
	} else if mp != "" {
		s.mu.Unlock()
		return fmt.Errorf("remove snapshot %s: still mounted on %s: %w", key, mp, errdefs.ErrFailedPrecondition)
	}
	trash, err := s.unlinkLocked(activeBucket, key, dir)
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("remove snapshot %s: %w", key, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("remove snapshot %s: delete %s: %w", key, trash, err)
	}
	return nil
}

// overlayMountOf returns the mount point of an overlay mount using upper as its upper
// dir, or "" when there is none.
func overlayMountOf(upper string) (string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || g[0] != "overlay" {
			continue
		}
		for _, o := range strings.Split(g[2], ",") {
			if o == "upperdir="+upper {
				return unescapeMountinfo(f[4]), nil
			}
		}
	}
	return "", nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space…) of mountinfo.
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Usage returns the disk space and inodes of all snapshots: the sizes recorded when
// layers were unpacked (layers never change) plus a walk of every writable snapshot.
func (s *Snapshotter) Usage() (bytes, inodes int64, err error) {
	err = s.st.ForEach(layerBucket, func(key string, data []byte) error {
		var rec layerRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("decode snapshot %s: %w", key, err)
		}
		bytes += rec.Size
		inodes += rec.Inodes
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot usage: %w", err)
	}
	var dirs []string
	err = s.st.ForEach(activeBucket, func(key string, data []byte) error {
		var rec activeRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("decode active snapshot %s: %w", key, err)
		}
		dirs = append(dirs, filepath.Join(s.dir(rec.ID), "fs"))
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot usage: %w", err)
	}
	for _, d := range dirs {
		b, n, err := diskUsage(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the scan
		}
		if err != nil {
			return 0, 0, fmt.Errorf("snapshot usage: %w", err)
		}
		bytes += b
		inodes += n
	}
	return bytes, inodes, nil
}

// ActiveUsage returns the disk space and inodes written into the writable snapshot key
// (its upper dir: what the container added or changed, not the image's layers). It
// walks the directory, so callers cache the answer. errdefs.ErrNotFound when absent.
func (s *Snapshotter) ActiveUsage(key string) (bytes, inodes int64, err error) {
	s.mu.Lock()
	var rec activeRecord
	err = s.get(activeBucket, key, &rec)
	s.mu.Unlock()
	if err != nil {
		return 0, 0, fmt.Errorf("usage of snapshot %s: %w", key, err)
	}
	return diskUsage(filepath.Join(s.dir(rec.ID), "fs"))
}

// diskUsage returns the allocated bytes and the inodes under dir, counting hard-linked
// files once, as du does.
func diskUsage(dir string) (bytes, inodes int64, err error) {
	seen := map[uint64]bool{}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path != dir && errors.Is(err, fs.ErrNotExist) {
				return nil // deleted by a running container meanwhile
			}
			return err
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if st.Nlink > 1 && !fi.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		bytes += st.Blocks * 512
		inodes++
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("disk usage of %s: %w", dir, err)
	}
	return bytes, inodes, nil
}

// supportsIndex tells whether this kernel's overlay knows the index option.
func supportsIndex() bool {
	_, err := os.Stat("/sys/module/overlay/parameters/index")
	return err == nil
}

// exists tells whether path exists (without following a final symlink).
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// get reads a record. A missing one is a bare errdefs.ErrNotFound, for callers to name
// in their own terms (the store's message would repeat the key).
func (s *Snapshotter) get(bucket, key string, v any) error {
	err := s.st.Get(bucket, key, v)
	if errdefs.IsNotFound(err) {
		return errdefs.ErrNotFound
	}
	return err
}

// ReadOnlyMounts returns how to mount layer chainID and its ancestors read-only, for
// an image volume: no upper dir, so nothing is written and nothing needs removing but
// the mount. One layer is a read-only bind of its directory (overlay wants two lower
// dirs when it has no upper one); more are an overlay of lower dirs only.
func (s *Snapshotter) ReadOnlyMounts(chainID digest.Digest) ([]Mount, error) {
	s.mu.Lock()
	lowers, err := s.chainLocked(chainID)
	s.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("read-only mounts of %s: %w", chainID, err)
	}
	if len(lowers) == 1 {
		return []Mount{{Type: "bind", Source: lowers[0], Options: []string{"ro", "rbind"}}}, nil
	}
	opts := "lowerdir=" + strings.Join(lowers, ":")
	if n := len(opts); n >= os.Getpagesize() {
		return nil, fmt.Errorf("read-only mounts of %s: %d layers need %d bytes of overlay mount options, more than the %d a mount takes: %w",
			chainID, len(lowers), n, os.Getpagesize()-1, errdefs.ErrInvalidArgument)
	}
	return []Mount{{Type: "overlay", Source: "overlay", Options: []string{opts}}}, nil
}
