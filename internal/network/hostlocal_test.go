package network

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// useHostLocalIPAM rewrites the fake network's config so that its plugin names
// host-local as IPAM with its store under the fake dir, and returns the store of the
// network (dataDir/fakenet).
func (f *fakeNet) useHostLocalIPAM(plugin string) string {
	f.t.Helper()
	dataDir := filepath.Join(f.dir, "ipam")
	writeFiles(f.t, filepath.Join(f.dir, "net.d"), map[string]string{"10-fake.conflist": fmt.Sprintf(
		`{"cniVersion":"1.0.0","name":"fakenet","plugins":[{"type":%q,"ipam":{"type":"host-local","dataDir":%q}}]}`, plugin, dataDir)})
	store := filepath.Join(dataDir, "fakenet")
	if err := os.MkdirAll(store, 0o755); err != nil {
		f.t.Fatal(err)
	}
	return store
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestReleaseFreesUnownedReservation: undoing a pod creation frees the reservation a
// host-local killed between creating it and writing its owner left (no DEL can: DEL
// finds by container id), but only once no host-local holds the store's lock, and
// nothing that has an owner.
func TestReleaseFreesUnownedReservation(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-fake")
	store := f.useHostLocalIPAM("crisp-fake")
	writeFiles(t, store, map[string]string{
		"10.99.0.7":          "",                  // the killed host-local's
		"10.99.0.8":          "other-pod\r\neth0", // another pod's
		"last_reserved_ip.0": "10.99.0.8",
		"lock":               "",
	})
	// A host-local still running holds the lock: the empty file may be its reservation
	// in the making.
	lock, err := os.Open(filepath.Join(store, "lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	removedEarly := make(chan bool, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		removedEarly <- !exists(filepath.Join(store, "10.99.0.7"))
		_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	}()
	if err := f.m.Release(context.Background(), fakePod()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if <-removedEarly {
		t.Error("the empty reservation was removed while a host-local held the store's lock")
	}
	if exists(filepath.Join(store, "10.99.0.7")) {
		t.Error("the reservation without an owner is still there")
	}
	for _, keep := range []string{"10.99.0.8", "last_reserved_ip.0", "lock"} {
		if !exists(filepath.Join(store, keep)) {
			t.Errorf("%s was removed", keep)
		}
	}
}

// TestAddKilledFreesUnownedReservation: an ADD whose host-local is killed (here at the
// CNI timeout) between reserving an address and recording the pod leaves nothing once
// Setup returns.
func TestAddKilledFreesUnownedReservation(t *testing.T) {
	f := newFakeNet(t, 500*time.Millisecond, "crisp-fake")
	store := f.useHostLocalIPAM("crisp-fake")
	f.set("crisp-fake", "ADD", "reserve-hang")
	_, err := f.m.Setup(context.Background(), fakePod())
	if err == nil {
		t.Fatal("Setup with a hung plugin succeeded")
	}
	if exists(filepath.Join(store, "10.99.0.9")) {
		t.Errorf("the reservation the killed plugin left without an owner is still there (Setup: %v)", err)
	}
}

// TestCallerCancelLetsAddFinish: a caller that gives up does not kill an ADD that
// finishes within the grace: killed at once, a plugin could be anywhere, even between
// reserving an address and recording whose it is.
func TestCallerCancelLetsAddFinish(t *testing.T) {
	f := newFakeNet(t, time.Minute, "crisp-slow")
	f.m.cfg.CancelGrace = 5 * time.Second
	f.set("crisp-slow", "ADD", "slow")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := f.m.Setup(ctx, fakePod()); err != nil {
		t.Errorf("Setup: %v", err)
	}
	if !slices.Contains(f.calls(), "crisp-slow ADD done") {
		t.Errorf("the ADD was cut short: calls %q", f.calls())
	}
}
