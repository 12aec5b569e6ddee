-- Whether the server knows a setting: newer servers replace insert_deduplicate with deduplicate_insert.
SELECT count() AS known
FROM system.settings
WHERE name = {name:String}
