package cri

import (
	"fmt"
	"sync"

	"github.com/containerd/errdefs"
)

// nameIndex reserves pod names so that two RunPodSandbox calls with the same metadata
// can never both create a pod.
type nameIndex struct {
	mu    sync.Mutex
	names map[string]string // name -> id
}

func newNameIndex() *nameIndex { return &nameIndex{names: map[string]string{}} }

// reserve claims name for id; it fails, naming the holder, if another id has it.
func (n *nameIndex) reserve(name, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if holder, ok := n.names[name]; ok && holder != id {
		return fmt.Errorf("pod name %q is already reserved for pod %s: %w", name, holder, errdefs.ErrAlreadyExists)
	}
	n.names[name] = id
	return nil
}

// release frees name if id holds it.
func (n *nameIndex) release(name, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.names[name] == id {
		delete(n.names, name)
	}
}
