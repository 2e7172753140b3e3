package mysqllock_test

import (
	"strings"
	"testing"

	"github.com/oversold-lab/oversold/locking/mysqllock"
)

// Galera and Group Replication are refused with one error naming them
// (review-4 M4): the lease table is MEMORY, which neither keeps exclusion
// on. The variables are what SHOW GLOBAL VARIABLES gives on each.
func TestUnsupportedTopologies(t *testing.T) {
	for _, c := range []struct {
		name string
		vars map[string]string
		logs bool
		want string // "" = accepted
	}{
		{"plain MariaDB", map[string]string{"wsrep_on": "OFF"}, false, ""},
		{"plain MySQL", map[string]string{}, false, ""},
		{"MySQL, plugin loaded, no group", map[string]string{"group_replication_group_name": ""}, false, ""},
		{"Galera", map[string]string{"wsrep_on": "ON"}, false, "Galera"},
		{"Group Replication", map[string]string{"group_replication_group_name": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"}, false, "Group Replication"},
		{"binlog on, statements logged", map[string]string{"wsrep_on": "OFF"}, true, "sql_log_bin=0"},
	} {
		err := mysqllock.CheckTopology(c.vars, c.logs)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got %v, want an error naming %q", c.name, err, c.want)
		}
	}
}
