package mysqllock

// QueueName exposes the key's named lock to the tests.
var QueueName = queueName
