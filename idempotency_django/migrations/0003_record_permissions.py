"""Reading stored response bodies in the admin needs its own permission.

Only the permission is new; Django creates it after migrate (post_migrate).
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("idempotency_django", "0002_record_digest"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="idempotencyrecord",
            options={
                "permissions": [("view_stored_response", "Can view stored response bodies")],
                "verbose_name": "idempotency record",
                "verbose_name_plural": "idempotency records",
            },
        ),
    ]
