package serverguard_test

import (
	"strings"
	"testing"

	"github.com/oversold-lab/oversold/locking/mysqllock/serverguard"
)

// Galera and Group Replication are refused with one error naming them:
// the lease table is MEMORY, which neither keeps exclusion on. So is a
// server that may lose a commit in a crash: the epoch bump would be lost
// and tokens repeat. The variables are what SHOW GLOBAL VARIABLES gives on
// each.
func TestUnsupportedSettings(t *testing.T) {
	durable := func(vars map[string]string) map[string]string {
		vars["innodb_flush_log_at_trx_commit"] = "1"
		return vars
	}
	for _, c := range []struct {
		name string
		vars map[string]string
		logs bool
		want string // "" = accepted
	}{
		{"plain MariaDB", durable(map[string]string{"wsrep_on": "OFF", "log_bin": "OFF", "sync_binlog": "0"}), false, ""},
		{"plain MySQL", durable(map[string]string{"log_bin": "ON", "sync_binlog": "1"}), false, ""},
		{"MySQL, plugin loaded, no group", durable(map[string]string{"group_replication_group_name": ""}), false, ""},
		{"MariaDB, flush at prepare and commit", map[string]string{"innodb_flush_log_at_trx_commit": "3"}, false, ""},
		{"Galera", durable(map[string]string{"wsrep_on": "ON"}), false, "Galera"},
		{"Group Replication", durable(map[string]string{"group_replication_group_name": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"}), false, "Group Replication"},
		{"binlog on, statements logged", durable(map[string]string{"wsrep_on": "OFF", "log_bin": "ON", "sync_binlog": "1"}), true, "sql_log_bin=0"},
		{"commits flushed once a second", map[string]string{"innodb_flush_log_at_trx_commit": "0"}, false, "innodb_flush_log_at_trx_commit=1"},
		{"commits written, flushed once a second", map[string]string{"innodb_flush_log_at_trx_commit": "2"}, false, "innodb_flush_log_at_trx_commit=1"},
		{"binlog on, not synced", durable(map[string]string{"log_bin": "ON", "sync_binlog": "0"}), false, "sync_binlog=1"},
		{"binlog on, synced every 100", durable(map[string]string{"log_bin": "ON", "sync_binlog": "100"}), false, "sync_binlog=1"},
	} {
		err := serverguard.CheckSettings(c.vars, c.logs)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got %v, want an error naming %q", c.name, err, c.want)
		}
	}
}
