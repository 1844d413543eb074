package store

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/crisp-runtime/crisp/internal/testutil/fulldisk"
)

// TestStoreFullDisk: a write that meets a full filesystem is ResourceExhausted, changes
// nothing (a multi-record Apply included), and once space is freed the same database
// takes writes again and reopens intact.
func TestStoreFullDisk(t *testing.T) {
	dir := fulldisk.New(t, "size=8m")
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
	fulldisk.Fill(t, filler)

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
