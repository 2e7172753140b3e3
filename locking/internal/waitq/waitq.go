// Package waitq is the waiter queue and wake-up shared by the redis and
// redlock backends: the Lua scripts that grant, renew and release a lock key
// on one Redis server while keeping a fair queue of its waiters, and the
// Notifier that carries the wake-ups to the waiting goroutines.
//
// # The queue
//
// A refused try queues its waiter on the server, in the same script: the
// sorted set "<lock>:waiters" keeps the order of first arrival (a place a
// later try never changes), and "<lock>:alive" the waiter's liveness
// deadline, which every try pushes back. Order and liveness are apart, so a
// waiter keeps its place while it waits and while it makes the round trip
// after its wake-up; only when it stops trying (it died, or gave up and
// could not say so) does its deadline pass and its place go. A release wakes
// the first live waiter, without taking it out of the queue, and a try that
// finds the lock free takes it only if no live waiter is ahead: a newcomer
// that arrives during the woken waiter's round trip queues behind it instead
// of taking the lock (fair handoff; Redisson's FairLock is fair the same
// way). A waiter that gives up leaves the queue and, if the lock is free,
// passes the wake-up on, in one script.
//
// With direct handoff (the scripts' 'g' flag; the redis backend, not
// Redlock) a release does not wake the first live waiter to try: it sets
// the key to that waiter's owner, counts the fence, takes the waiter out of
// the queue and sends it the token, and the waiter holds the lock on
// receipt. The key's PX is the waiter's choice, stated in its member
// (HandoffMember), not the releaser's TTL; a member that states none is
// only woken. Its try, if the message is lost, finds its own owner in the
// key and takes the lock with the counter's value; if it gave up, its
// leave deletes the key and hands it on.
//
// The wake-up is a message on "<lock>:wake:<locker id>" whose payload names
// the waiter ("<member>", or "<member> <token> <px>" for a handoff): one
// Notifier per Redis server and process subscribes to its Locker's
// channels and wakes that waiter alone.
package waitq

import (
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed queue.lua
	queueLua string
	//go:embed acquire.lua
	acquireLua string
	//go:embed renew.lua
	renewLua string
	//go:embed release.lua
	releaseLua string
)

// Scripts are the three scripts of a lock key. A backend keeps its own copy
// (Default), so that its tests can swap one for a broken variant.
type Scripts struct {
	// Acquire: KEYS lock, queue, alive[, fence]; ARGV owner, ttl ms,
	// member, life ms, place in µs ('' = the server's time), wake prefix,
	// 'keep' to keep the place when granted (else ''), 's' to wake with
	// SPUBLISH (Redis Cluster; else '' or absent), 'g' with direct
	// handoff (else '' or absent), 't' to refuse an owner or member a
	// release buried here (Redlock; else absent). Returns {1, token} or
	// {0, ms to wait at most, holder[, fence counter, waiters ahead with
	// 'g']}.
	Acquire *redis.Script
	// Renew: KEYS lock; ARGV owner, ttl ms. Returns 1 if extended.
	Renew *redis.Script
	// Release: KEYS lock, queue, alive[, fence]; ARGV owner, wake prefix,
	// member giving up or '', '1' to wake the first waiter or 'g' to hand
	// it the lock (direct handoff: needs the fence; only a HandoffMember
	// is handed the lock, the others are woken), 's' to wake with
	// SPUBLISH (else '' or absent), ttl ms, 't' to bury the owner and the
	// member for ttl: a tombstone that makes a late acquire of theirs
	// refused (Redlock, whose undo can overtake the acquire it undoes;
	// else absent). Returns 1 if released.
	Release *redis.Script
}

// Default are the owner-checked scripts with the fair queue.
var Default = Scripts{
	Acquire: redis.NewScript(queueLua + acquireLua),
	Renew:   redis.NewScript(renewLua),
	Release: redis.NewScript(queueLua + releaseLua),
}

// Names are the Redis names of one lock key, all in the hash slot of {key}:
// the lock, its fence counter, its queue and the liveness of its waiters,
// and the prefix of the channels that wake them (one per Locker: Wake +
// Locker id).
type Names struct{ Lock, Fence, Queue, Alive, Wake string }

// CheckKey refuses a key NamesOf cannot use: an empty one, or one with a
// brace, which would end the hash tag early or open another (the lock and
// its fence counter could then land in different slots of a Cluster).
func CheckKey(key string) error {
	switch {
	case key == "":
		return errors.New(`acquire "": empty key`)
	case strings.ContainsAny(key, "{}"):
		return fmt.Errorf("acquire %q: a key may not contain { or } (they delimit the Redis Cluster hash tag)", key)
	}
	return nil
}

// NamesOf returns the names of key's lock under prefix (see CheckKey).
func NamesOf(prefix, key string) Names {
	lock := prefix + "{" + key + "}"
	return Names{Lock: lock, Fence: lock + ":fence", Queue: lock + ":waiters", Alive: lock + ":alive", Wake: lock + ":wake:"}
}

// Member names a waiter in the queue and in its wake-up: its Locker's id
// (which names the channel), then its own owner value.
func Member(lockerID, owner string) string { return lockerID + ":" + owner }

// HandoffMember names a waiter that a release may hand the lock to
// (release.lua's 'g'): Member, then the PX in ms the handed key is set to,
// which the wake-up repeats after the token ("<member> <token> <px>").
func HandoffMember(lockerID, owner string, px time.Duration) string {
	return Member(lockerID, owner) + ":" + strconv.FormatInt(px.Milliseconds(), 10)
}

// NewOwner returns 16 random bytes in hex: owners never repeat, so an owner
// check cannot mistake another holder, or another try, for this one.
func NewOwner() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go 1.24)
	return hex.EncodeToString(b[:])
}

// Backoff is a waiter's fallback wait before try number attempt+1, for when
// no wake-up comes: exponential from lo to hi, with jitter (so waiters of
// several processes do not retry in step), and capped by limit, when the
// lock is sure to be free or the first waiter's place to expire (negative:
// unknown), plus a jitter below lo. It is never more than hi: a waiter's
// place in the queue outlives hi (its life), whatever lo is.
func Backoff(lo, hi time.Duration, attempt int, limit time.Duration) time.Duration {
	d := hi
	if attempt < 30 {
		d = min(d, lo<<attempt)
	}
	d = d/2 + mrand.N(d/2+1)
	if limit >= 0 && limit < d {
		d = min(d, limit+mrand.N(lo))
	}
	return d
}
