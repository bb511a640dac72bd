-- docker-compose: the sink database for txjoin's PostgreSQL sink (`txjoin up` creates it too).
CREATE DATABASE sink;
