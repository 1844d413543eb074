package crilog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/crisp-runtime/crisp/internal/testutil/fulldisk"
)

// TestFullDiskDropsAndResumes: on a full filesystem every byte given to a stream is
// still consumed, the records that could not be written are counted, the file holds
// only whole records (a short write's remains are cut off), and once space is freed
// the next records are written.
func TestFullDiskDropsAndResumes(t *testing.T) {
	dir := fulldisk.New(t, "size=1m")
	path := filepath.Join(dir, "c.log")
	w, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	out := w.Stream(Stdout)

	// Lines of 1000 bytes in batches of 7: batches do not end on a page boundary, so
	// the write that meets the full disk is a short one.
	line := strings.Repeat("x", 990)
	var batches, failed int
	for failed < 5 {
		var b strings.Builder
		for i := 0; i < 7; i++ {
			fmt.Fprintf(&b, "%04d %s\n", batches*7+i, line)
		}
		n, err := out.Write([]byte(b.String()))
		if n != b.Len() {
			t.Fatalf("Write consumed %d of %d bytes", n, b.Len())
		}
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("write on a full disk: %v, want ENOSPC", err)
			}
			failed++
		}
		batches++
		if batches > 10000 {
			t.Fatal("1 MiB tmpfs never filled up")
		}
	}
	records, bytes := w.Dropped()
	if records != 5*7 || bytes < 5*7*1000 {
		t.Errorf("dropped %d records, %d bytes; want 35 records of over 1000 bytes", records, bytes)
	}
	written := parse(t, path) // fails on a partial record
	if want := (batches - failed) * 7; len(written) != want {
		t.Errorf("%d records in the file, want the %d of the batches written", len(written), want)
	}
	t.Logf("%d records written, %d dropped (%d bytes)", len(written), records, bytes)

	// Free space: the log goes on where it stopped.
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := out.Write([]byte("after\n")); err != nil {
		t.Fatalf("write after space was freed: %v", err)
	}
	recs := parse(t, path)
	if len(recs) != 1 || recs[0].text != "after" {
		t.Fatalf("records after space was freed: %+v", recs)
	}
	if r, _ := w.Dropped(); r != records {
		t.Errorf("dropped count changed to %d by a successful write", r)
	}
}
