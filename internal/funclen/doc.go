// Package funclen holds a test that keeps the product's functions short enough
// to read in one sitting: no function in order, storage, inventory or locking
// runs over 80 lines, counted from "func" to its closing brace.
package funclen
