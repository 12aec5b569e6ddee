-- The sample tables' process names (migration 0025), loaded again after the sink wrote new ones.
SYSTEM RELOAD DICTIONARY process_names_by_id
