package waitq

// Slot is slot, for the tests.
var Slot = slot
