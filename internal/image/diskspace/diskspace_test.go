package diskspace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
)

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 812: "812 B", 1024: "1 KiB", 512 << 20: "512 MiB", 3<<30 + 200<<20: "3.2 GiB", 25167360: "24 MiB",
	} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestClassify(t *testing.T) {
	dir := t.TempDir()
	full := fmt.Errorf("write x: %w", &os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC})
	for _, tc := range []struct {
		name      string
		err       error
		exhausted bool
	}{
		{"nil", nil, false},
		{"enospc", full, true},
		{"edquot", fmt.Errorf("w: %w", syscall.EDQUOT), true},
		{"joined", errors.Join(errors.New("other"), full), true},
		{"other", errors.New("boom"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Classify(tc.err, dir)
			if errdefs.IsResourceExhausted(got) != tc.exhausted {
				t.Fatalf("Classify(%v) = %v", tc.err, got)
			}
			if tc.exhausted && (!strings.Contains(got.Error(), dir) || !errors.Is(got, tc.err)) {
				t.Errorf("Classify(%v) = %v: want the path and the cause kept", tc.err, got)
			}
			if !tc.exhausted && got != tc.err {
				t.Errorf("Classify changed %v to %v", tc.err, got)
			}
		})
	}
}

// TestReserveReader: a reserve no filesystem can keep refuses before the first byte;
// a disabled one passes the reader through; one that fits reads everything.
func TestReserveReader(t *testing.T) {
	dir := t.TempDir()
	sp, err := Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	src := strings.NewReader(strings.Repeat("x", 10<<20))
	if r := (Reserve{}).Reader(src, "x"); r != io.Reader(src) {
		t.Error("a disabled reserve wrapped the reader")
	}
	_, err = io.Copy(io.Discard, Reserve{Path: dir, Bytes: sp.Total + 1}.Reader(src, "layer"))
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "layer: stopped after 0 B: the image filesystem "+dir) {
		t.Fatalf("reserve above the filesystem size: %v", err)
	}
	n, err := io.Copy(io.Discard, Reserve{Path: dir, Bytes: 1}.Reader(src, "layer"))
	if err != nil || n != 10<<20 {
		t.Fatalf("small reserve: read %d, %v", n, err)
	}
	if err := (Reserve{Path: dir, Percent: 99.999}).Check(sp.Free, "pull"); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "pull needs") {
		t.Fatalf("Check of everything free against a 99.999%% reserve: %v", err)
	}
}
