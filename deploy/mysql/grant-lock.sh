# Sourced by the mysql image's entrypoint on the first start (bash, a
# temporary server, root over its socket). The mysql lock keeps its
# in-memory lease tables out of the binary log with SET sql_log_bin=0
# (locking/README.md, "MySQL"), which MySQL 8 allows a user holding
# SESSION_VARIABLES_ADMIN and MariaDB one holding BINLOG ADMIN. MySQL 8
# writes a binary log by default, so without this grant orderd with
# OVERSOLD_LOCK=mysql stops at start naming the missing privilege.
if declare -F docker_process_sql >/dev/null; then
	# The official mysql image (MySQL 8).
	docker_process_sql --database=mysql <<<"GRANT SESSION_VARIABLES_ADMIN ON *.* TO '$MYSQL_USER'@'%';"
else
	# deploy/images/mysql (MariaDB, the same entrypoint contract).
	MYSQL_PWD=$pw sql <<<"GRANT BINLOG ADMIN ON *.* TO '$MYSQL_USER'@'%';"
fi
