-- Run once by the postgres image on first start: the worker's own role and database,
-- matching services/pg-up.sh for local runs.
CREATE ROLE extworker LOGIN PASSWORD 'extworker';
CREATE DATABASE extworker OWNER extworker;
