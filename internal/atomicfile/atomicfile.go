// Package atomicfile replaces files so that a reader never sees half of one: the data
// goes to a temporary file beside the target, which is then renamed over it. Records a
// crash must not tear (sandbox.json, bootstrap files, the pod's /etc files, CNI
// configs) are written through it.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with data, with mode perm. The temporary file is a dot file with
// a random suffix and no extension of path's, so concurrent writers do not collide
// and a directory scanned by extension (a CNI config dir) never picks it up.
func Write(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, false)
}

// WriteSync is Write with the data flushed to disk before the rename, for files that
// must survive a power loss whole.
func WriteSync(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, true)
}

func write(path string, data []byte, perm os.FileMode, sync bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil && sync {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
