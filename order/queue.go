package order

// OrderQueue is the order queue of OVERSOLD_ACCEPT=queue
// (inventory.Queue); nil in Config: accept sync.
type OrderQueue interface{}
