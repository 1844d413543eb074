package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

// Store is an open metadata database; safe for concurrent use.
//
// A write that meets a full filesystem fails with errdefs.ErrResourceExhausted and
// changes nothing: bbolt writes a transaction's pages before the meta page that makes
// them current, and on a failed commit it rolls back and reloads its free list from
// the last committed one, so the database stays usable and later writes succeed once
// there is space again (TestStoreFullDisk).
type Store struct {
	db   *bolt.DB
	path string
}

// Open opens (creating if needed) the database file at path. A second process opening
// the same file waits up to a few seconds and then fails: two criservers on one root
// dir would corrupt each other's view.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create database dir: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open database %s (is another criserver using this root dir?): %w", path, err)
	}
	return &Store{db: db, path: path}, nil
}

// full adds errdefs.ErrResourceExhausted to an error caused by a full filesystem (or
// quota), so that callers report ResourceExhausted and not an unknown failure.
func (s *Store) full(err error) error {
	if err == nil || errdefs.IsResourceExhausted(err) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: the filesystem holding the metadata database %s is full; nothing was changed: %w", err, s.path, errdefs.ErrResourceExhausted)
	}
	return err
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Put stores v as JSON under key in bucket, replacing what was there.
func (s *Store) Put(bucket, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", bucket, key, err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte(bucket))
		if err != nil {
			return err
		}
		return b.Put([]byte(key), data)
	})
	if err != nil {
		return fmt.Errorf("store %s/%s: %w", bucket, key, s.full(err))
	}
	return nil
}

// Op is one change of an Apply: a Put of Value under Key in Bucket, or a Delete of
// Key when Delete is set.
type Op struct {
	Bucket, Key string
	Value       any
	Delete      bool
}

// Apply makes all of ops in one transaction: either every one is stored or, on any
// error (a full disk included), none is. Records that belong together (an image and
// the references naming it) are written this way so that no failure leaves one
// without the other.
func (s *Store) Apply(ops ...Op) error {
	encoded := make([][]byte, len(ops))
	for i, op := range ops {
		if op.Delete {
			continue
		}
		data, err := json.Marshal(op.Value)
		if err != nil {
			return fmt.Errorf("encode %s/%s: %w", op.Bucket, op.Key, err)
		}
		encoded[i] = data
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		for i, op := range ops {
			if op.Delete {
				if b := tx.Bucket([]byte(op.Bucket)); b != nil {
					if err := b.Delete([]byte(op.Key)); err != nil {
						return fmt.Errorf("delete %s/%s: %w", op.Bucket, op.Key, err)
					}
				}
				continue
			}
			b, err := tx.CreateBucketIfNotExists([]byte(op.Bucket))
			if err != nil {
				return fmt.Errorf("bucket %s: %w", op.Bucket, err)
			}
			if err := b.Put([]byte(op.Key), encoded[i]); err != nil {
				return fmt.Errorf("store %s/%s: %w", op.Bucket, op.Key, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store %d records: %w", len(ops), s.full(err))
	}
	return nil
}

// Get decodes the record under key into v; errdefs.ErrNotFound when there is none.
func (s *Store) Get(bucket, key string, v any) error {
	var data []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte(bucket)); b != nil {
			if d := b.Get([]byte(key)); d != nil {
				data = append([]byte(nil), d...)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read %s/%s: %w", bucket, key, err)
	}
	if data == nil {
		return fmt.Errorf("%s/%s: %w", bucket, key, errdefs.ErrNotFound)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode %s/%s: %w", bucket, key, err)
	}
	return nil
}

// Delete removes key from bucket; removing a missing key is not an error.
func (s *Store) Delete(bucket, key string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			return nil
		}
		return b.Delete([]byte(key))
	})
	if err != nil {
		return fmt.Errorf("delete %s/%s: %w", bucket, key, s.full(err))
	}
	return nil
}

// ForEach calls fn with every record of bucket in key order. The data slice is only
// valid during the call.
func (s *Store) ForEach(bucket string, fn func(key string, data []byte) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error { return fn(string(k), v) })
	})
}
