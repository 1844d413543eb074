package cri

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/crisp-runtime/crisp/internal/fifoio"
)

// shimLateness is how long the fake shim of TestStreamStdinWaitsForShimReader takes to
// open its ends of the stdin FIFO after the exec started.
const shimLateness = 200 * time.Millisecond

// TestStreamStdinWaitsForShimReader plays containerd's runc shim, which opens its ends
// of an exec's stdin FIFO in goroutines (containerd/fifo with O_NONBLOCK) that may run
// after its Start returned: the client's input and its EOF (CloseIO) must wait for the
// shim's reader, or the input is lost with the pipe and the shim's reader, opened
// after every writer left, blocks for ever and the process never reads EOF. An empty
// input (`kubectl exec -i ... </dev/null`) must wait too: there is nothing to drain.
func TestStreamStdinWaitsForShimReader(t *testing.T) {
	for _, input := range []string{"fed\n", ""} {
		t.Run(fmt.Sprintf("%q", input), func(t *testing.T) { testStdinWaitsForShimReader(t, input) })
	}
}

func testStdinWaitsForShimReader(t *testing.T, input string) {
	sio, err := openStreamFIFOs(t.TempDir(), strings.NewReader(input), nil, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer sio.close()
	closeIO := make(chan struct{})
	sio.startStdin(strings.NewReader(input), func() { close(closeIO) })

	select {
	case <-closeIO:
		t.Error("stdin closed (CloseIO) before the shim opened its reader of the FIFO")
	case <-time.After(shimLateness):
	}
	// The shim's reader, then its own writer, which it keeps until CloseIO.
	path := filepath.Join(sio.dir, "stdin")
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-closeIO:
	case <-time.After(5 * time.Second):
		t.Fatal("no CloseIO after the client's EOF")
	}
	w.Close()

	var got bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- fifoio.CopyFIFOIn(&got, r) }()
	select {
	case err := <-done:
		if err != nil || got.String() != input {
			t.Errorf("the shim read %q (%v), want %q then EOF", got.String(), err, input)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the shim's reader saw no EOF; read %q", got.String())
	}
}

// TestStreamStdinSessionEndsBeforeShim: a session that ends before the shim opened
// the stdin FIFO (the exec failed) leaves no goroutine waiting for a reader and calls
// no CloseIO.
func TestStreamStdinSessionEndsBeforeShim(t *testing.T) {
	sio, err := openStreamFIFOs(t.TempDir(), strings.NewReader("x"), nil, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	closeIO := make(chan struct{})
	sio.startStdin(strings.NewReader("x"), func() { close(closeIO) })
	time.Sleep(50 * time.Millisecond)
	sio.close()
	select {
	case <-closeIO:
		t.Error("CloseIO of a session whose stdin FIFO the shim never opened")
	case <-time.After(200 * time.Millisecond):
	}
}
