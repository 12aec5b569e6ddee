-- The store's database, created on open so that migrations can run inside it.
CREATE DATABASE IF NOT EXISTS {database:Identifier}
