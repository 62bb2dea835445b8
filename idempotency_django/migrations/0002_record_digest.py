"""Records are found by one digest of principal, location and key.

The unique constraint on the three text columns compared them with the
database's collation: on MySQL/MariaDB "Key" and "key ", or two tenants
"Portland" and "portland", were the same record. Existing records get their
digest here, so they keep replaying.
"""

from typing import Any

from django.db import migrations, models

from idempotency_django.stores.digests import record_digest

BATCH = 2000


def fill_digests(apps: Any, schema_editor: Any) -> None:
    records = apps.get_model("idempotency_django", "IdempotencyRecord")
    rows = records.objects.using(schema_editor.connection.alias).order_by("pk")
    last = 0
    while True:
        batch = list(rows.filter(pk__gt=last).only("pk", "principal", "location", "key")[:BATCH])
        if not batch:
            return
        for record in batch:
            record.digest = record_digest(record.principal, record.location, record.key)
        rows.bulk_update(batch, ["digest"])
        last = batch[-1].pk


class Migration(migrations.Migration):
    dependencies = [("idempotency_django", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="idempotencyrecord",
            name="digest",
            field=models.CharField(default="", max_length=64, verbose_name="digest"),
            preserve_default=False,
        ),
        migrations.RunPython(fill_digests, migrations.RunPython.noop, elidable=True),
        migrations.RemoveConstraint(
            model_name="idempotencyrecord", name="idempotency_record_unique_key"
        ),
        migrations.AddConstraint(
            model_name="idempotencyrecord",
            constraint=models.UniqueConstraint(
                fields=("digest",), name="idempotency_record_unique_digest"
            ),
        ),
    ]
