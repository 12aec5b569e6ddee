-- The replay table again (its views first): made for one repair and dropped after it.
DROP TABLE IF EXISTS {replay:Identifier}
