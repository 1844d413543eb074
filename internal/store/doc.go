// Package store is crisp's metadata database: JSON records in named bbolt buckets
// under the root dir. It persists and returns records; it must not interpret them or
// hold any lock beyond a single transaction.
package store
