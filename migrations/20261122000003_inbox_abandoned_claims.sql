-- The retention job also deletes inbox claims that were never processed (a worker stopped or
-- crashed before publishing), once any copy of their message is gone: this index finds them
-- by age without reading the processed ones.
CREATE INDEX inbox_unprocessed_by_claim ON inbox (claimed_until) WHERE processed_at IS NULL;
