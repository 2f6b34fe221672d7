"""What sits on disk: the image shards and task tables with their schemas and checks
(``shards``), the world manifest (``world``) and zero-copy views of Arrow columns
(``arrow_views``)."""
