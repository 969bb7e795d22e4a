-- migrate_prerequisites --
-- Who migrates where, and whether that role may create tables in the schema objects go to.
SELECT current_user AS role_name, current_database() AS database_name,
       current_schema() AS schema_name,
       coalesce(has_schema_privilege(current_schema(), 'CREATE'), false) AS can_create
