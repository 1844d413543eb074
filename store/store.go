package store

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

// Store is an open metadata database; safe for concurrent use.
type Store struct {
	db *bolt.DB
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
	return &Store{db: db}, nil
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
		return fmt.Errorf("store %s/%s: %w", bucket, key, err)
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
		return fmt.Errorf("delete %s/%s: %w", bucket, key, err)
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
