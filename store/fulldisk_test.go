package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// smallFS mounts a tmpfs of size bytes on a new directory, unmounted when the test ends.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a size-limited tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes zeros to path until the filesystem is full and returns the bytes written.
func fill(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			return n
		}
		if err != nil {
			t.Fatalf("fill %s: %v", path, err)
		}
	}
}

// TestStoreFullDisk: a write that meets a full filesystem is ResourceExhausted, changes
// nothing (a multi-record Apply included), and once space is freed the same database
// takes writes again and reopens intact.
func TestStoreFullDisk(t *testing.T) {
	dir := smallFS(t, "8m")
	path := filepath.Join(dir, "meta.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	if err := s.Put("b", "before", rec{Name: "before"}); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	fill(t, filler)

	big := rec{Name: strings.Repeat("x", 1<<20)}
	err = s.Put("b", "big", big)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), path) {
		t.Fatalf("put on a full disk: err = %v, want ResourceExhausted naming %s", err, path)
	}
	err = s.Apply(Op{Bucket: "b", Key: "small", Value: rec{Name: "small"}}, Op{Bucket: "b", Key: "big", Value: big}, Op{Bucket: "b", Key: "before", Delete: true})
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("apply on a full disk: err = %v, want ResourceExhausted", err)
	}
	var got rec
	for _, k := range []string{"small", "big"} {
		if err := s.Get("b", k, &got); !errdefs.IsNotFound(err) {
			t.Fatalf("get %s after failed writes: %+v, %v; want not found", k, got, err)
		}
	}
	if err := s.Get("b", "before", &got); err != nil || got.Name != "before" {
		t.Fatalf("earlier record after failed writes: %+v, %v", got, err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(Op{Bucket: "b", Key: "small", Value: rec{Name: "small"}}, Op{Bucket: "b", Key: "big", Value: big}); err != nil {
		t.Fatalf("apply after space was freed: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	for _, want := range []rec{{Name: "before"}, {Name: "small"}, big} {
		key := want.Name
		if len(key) > 10 {
			key = "big"
		}
		if err := s.Get("b", key, &got); err != nil || !bytes.Equal([]byte(got.Name), []byte(want.Name)) {
			t.Fatalf("after reopen, %s: %v (name %d bytes)", key, err, len(got.Name))
		}
	}
}
