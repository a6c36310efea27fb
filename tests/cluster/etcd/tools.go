//go:build tools

// Package etcdbin pins etcd's server module, whose root package is etcd's main; the build
// script runs `go build go.etcd.io/etcd/server/v3` in this module.
package etcdbin

import _ "go.etcd.io/etcd/server/v3"
