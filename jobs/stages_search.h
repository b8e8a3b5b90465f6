/* jobs/stages_search.h — registration of the load and search stages. */
#ifndef AC_JOBS_STAGES_SEARCH_H
#define AC_JOBS_STAGES_SEARCH_H

/* Register "load" and "search" with the stage registry (jobs/stage.h). */
void stages_search_register(void);

#endif
