package cri

import (
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

func TestNameIndexConcurrentReserve(t *testing.T) {
	n := newNameIndex("pod")
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.reserve("pod_ns_uid_0", string(rune('a'+i))); err == nil {
				mu.Lock()
				won++
				mu.Unlock()
			} else if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "already reserved for pod") {
				t.Errorf("unexpected error %v", err)
			}
		}()
	}
	wg.Wait()
	if won != 1 {
		t.Fatalf("%d reservations won, want 1", won)
	}
}

func TestNameIndexReleaseOnlyByHolder(t *testing.T) {
	n := newNameIndex("container")
	if err := n.reserve("x", "a"); err != nil {
		t.Fatal(err)
	}
	if err := n.reserve("x", "a"); err != nil {
		t.Fatalf("re-reserve by holder: %v", err)
	}
	n.release("x", "b")
	if err := n.reserve("x", "b"); err == nil {
		t.Fatal("release by non-holder freed the name")
	}
	n.release("x", "a")
	if err := n.reserve("x", "b"); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

func TestNameIndexNamesItsKind(t *testing.T) {
	n := newNameIndex("container")
	if err := n.reserve("c_pod_ns_uid_0", "c1"); err != nil {
		t.Fatal(err)
	}
	err := n.reserve("c_pod_ns_uid_0", "c2")
	if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "already reserved for container c1") {
		t.Fatalf("err = %v, want AlreadyExists naming container c1", err)
	}
}
