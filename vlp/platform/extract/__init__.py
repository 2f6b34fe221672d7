"""Raw images → image shards: `vlp data extract`, a Ray Data batch-inference job."""
