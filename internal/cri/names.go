package cri

import (
	"fmt"
	"sync"

	"github.com/containerd/errdefs"
)

// nameIndex reserves the names of one kind of object (pods, or containers) so that two
// creates with the same metadata can never both succeed.
type nameIndex struct {
	kind  string // "pod" or "container": what the error messages name
	mu    sync.Mutex
	names map[string]string // name -> id
}

func newNameIndex(kind string) *nameIndex {
	return &nameIndex{kind: kind, names: map[string]string{}}
}

// reserve claims name for id; it fails, naming the holder, if another id has it.
func (n *nameIndex) reserve(name, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if holder, ok := n.names[name]; ok && holder != id {
		return fmt.Errorf("%s name %q is already reserved for %s %s: %w", n.kind, name, n.kind, holder, errdefs.ErrAlreadyExists)
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
