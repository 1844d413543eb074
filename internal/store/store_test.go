package store

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

type rec struct {
	Name string
	N    int
}

func TestStoreLifecycle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "meta.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Get("pods", "x", &rec{}); !errdefs.IsNotFound(err) {
		t.Fatalf("missing bucket: err = %v, want not found", err)
	}
	for i, id := range []string{"b", "a", "c"} {
		if err := s.Put("pods", id, rec{Name: id, N: i}); err != nil {
			t.Fatal(err)
		}
	}
	var got rec
	if err := s.Get("pods", "a", &got); err != nil || got.N != 1 {
		t.Fatalf("get a = %+v, %v", got, err)
	}
	if err := s.Delete("pods", "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("pods", "a"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if err := s.Delete("nobucket", "a"); err != nil {
		t.Fatalf("delete from missing bucket: %v", err)
	}
	var keys []string
	if err := s.ForEach("pods", func(k string, d []byte) error {
		var r rec
		if err := json.Unmarshal(d, &r); err != nil {
			return err
		}
		keys = append(keys, k+"="+r.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] != "b=b" || keys[1] != "c=c" {
		t.Fatalf("keys = %v", keys)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopen: data survives.
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Get("pods", "c", &got); err != nil || got.Name != "c" {
		t.Fatalf("after reopen: %+v %v", got, err)
	}
	if err := s.ForEach("empty", func(string, []byte) error { return errors.New("called") }); err != nil {
		t.Fatal(err)
	}
}
