package image

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"

	"github.com/crisp-runtime/crisp/internal/image/snapshot"
)

// viewBucket records the read-only views of images (image volumes) by key. A view is
// only a record and a mount of the image's layers: the record is what keeps the image
// from being removed, and its layers from being freed, while the mount exists.
const viewBucket = "image-views"

// viewRecord is what the store keeps of one read-only view.
type viewRecord struct {
	ImageID string        `json:"image_id"`
	ChainID digest.Digest `json:"chain_id"`
	Created time.Time     `json:"created"`
}

// View records the read-only view key of img and returns how to mount it: the image's
// layers with nothing writable on top. Until RemoveView(key), Remove refuses the image
// and its layers are kept. errdefs.ErrNotFound when img is no longer in the store,
// errdefs.ErrAlreadyExists when key is taken, errdefs.ErrFailedPrecondition for an
// image without layers (there is nothing to mount).
func (s *Service) View(key string, img *Image) ([]snapshot.Mount, error) {
	if key == "" {
		return nil, fmt.Errorf("view of image %s: empty key: %w", img.ID, errdefs.ErrInvalidArgument)
	}
	chain := img.TopChainID()
	if chain == "" {
		return nil, fmt.Errorf("view of image %s: the image has no layers, so nothing to mount: %w", img.ID, errdefs.ErrFailedPrecondition)
	}
	// Under s.mu, as Remove checks the views: either Remove sees this view, or the
	// image is gone here.
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.images[img.ID]; !ok {
		return nil, fmt.Errorf("view of image %s: %w", img.ID, errdefs.ErrNotFound)
	}
	var existing viewRecord
	if err := s.store.Get(viewBucket, key, &existing); err == nil {
		return nil, fmt.Errorf("view %s: %w", key, errdefs.ErrAlreadyExists)
	} else if !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("view %s: %w", key, err)
	}
	mounts, err := s.snaps.ReadOnlyMounts(chain)
	if err != nil {
		return nil, fmt.Errorf("view of image %s: %w", img.ID, err)
	}
	rec := viewRecord{ImageID: img.ID, ChainID: chain, Created: time.Now().UTC()}
	if err := s.store.Put(viewBucket, key, rec); err != nil {
		return nil, fmt.Errorf("record view %s of image %s: %w", key, img.ID, err)
	}
	return mounts, nil
}

// RemoveView drops the view key; the caller has unmounted it. Unknown keys are not
// an error.
func (s *Service) RemoveView(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.store.Delete(viewBucket, key); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove view %s: %w", key, err)
	}
	return nil
}

// ViewKeys lists the keys of every view, sorted, so that recovery can drop those no
// container owns.
func (s *Service) ViewKeys() ([]string, error) {
	var keys []string
	err := s.store.ForEach(viewBucket, func(key string, _ []byte) error {
		keys = append(keys, key)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list image views: %w", err)
	}
	sort.Strings(keys)
	return keys, nil
}

// viewsLocked returns the views by key; s.mu must be held.
func (s *Service) viewsLocked() (map[string]viewRecord, error) {
	views := map[string]viewRecord{}
	err := s.store.ForEach(viewBucket, func(key string, data []byte) error {
		var rec viewRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("decode image view %s: %w", key, err)
		}
		views[key] = rec
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list image views: %w", err)
	}
	return views, nil
}

// checkNoViewsLocked refuses (errdefs.ErrFailedPrecondition) to remove image id while
// a view of it exists, naming the views; s.mu must be held.
func (s *Service) checkNoViewsLocked(id string) error {
	views, err := s.viewsLocked()
	if err != nil {
		return err
	}
	var users []string
	for key, rec := range views {
		if rec.ImageID == id {
			users = append(users, key)
		}
	}
	if len(users) == 0 {
		return nil
	}
	sort.Strings(users)
	return fmt.Errorf("image %s is in use as a read-only volume (%s): remove the containers that mount it first: %w",
		id, strings.Join(users, ", "), errdefs.ErrFailedPrecondition)
}
