package zklock

// Escape is the key-to-node-name mapping, for the tests' Steal and Leftovers.
var Escape = escape
