package mount

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

func TestBindReadOnly(t *testing.T) {
	testutil.RequiresRoot(t, "mounts")
	src, dst := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := All([]Mount{{Type: "bind", Source: src, Options: []string{"rbind", "ro"}}}, dst); err != nil {
		t.Fatal(err)
	}
	defer Unmount(dst)
	if data, err := os.ReadFile(filepath.Join(dst, "f")); err != nil || string(data) != "x" {
		t.Fatalf("read through bind: %q %v", data, err)
	}
	if err := os.WriteFile(filepath.Join(dst, "g"), nil, 0o644); err == nil {
		t.Fatal("write to a read-only bind succeeded")
	}
	if err := Unmount(dst); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(dst); err != nil {
		t.Fatalf("second unmount: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "f")); !os.IsNotExist(err) {
		t.Fatal("still mounted")
	}
}

func TestParse(t *testing.T) {
	flags, data := parse([]string{"ro", "lowerdir=/a:/b", "upperdir=/u", "nosuid", "index=off"})
	if data != "lowerdir=/a:/b,upperdir=/u,index=off" || flags == 0 {
		t.Fatalf("flags %x data %q", flags, data)
	}
}
